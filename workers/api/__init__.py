"""The workers app's REST endpoints and the provider node's WebSocket.

``worker_views`` and ``urls``: registering a node and managing it (/api/v1/workers/);
``assignment_views`` and ``assignment_urls``: a node's one assignment (/api/v1/assignments/);
``node_socket``: ``/ws/worker/``, with its per-assignment limits in ``socket_limits``.
"""

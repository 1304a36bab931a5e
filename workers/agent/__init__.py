"""The provider node: key file, CLI, Celery worker, WebSocket reporter, runner.

Runs on untrusted machines: it never imports Django and never touches the database.
"""

AGENT_VERSION = "0.3.0"

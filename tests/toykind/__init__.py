"""A toy kind, written as a new kind is: one plug-in per side of the trust boundary.

``kind.py`` is the node's side (no Django; what ``training/<family>/kind.py`` holds),
``verifier.py`` the platform's (what ``workers/verification/<family>.py`` holds). Tests
register it for their own length only (``register``).
"""

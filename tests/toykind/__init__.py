"""A toy kind, written as a new kind is: one plug-in per side of the trust boundary.

``kind.py`` is the node's side (no Django; what ``training/<family>/kind.py`` holds),
``verifier.py`` the platform's (what ``workers/verification/<family>.py`` holds: its verifier
registers itself with ``@verifies``). ``tests/workers/test_toy_kinds.py`` lists the plug-in
with the node's kinds for each test's length only.
"""

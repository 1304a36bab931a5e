"""Assignments: handing tasks' jobs to workers and carrying them to a verdict.

``scheduler`` matches open tasks to online workers (``supply`` says who fits) and hands
out assignments through the node broker (``nodebroker``); ``jobs`` is what a worker does
with one (start, upload through ``uploads``, fail, submit); ``settlement`` pays or rejects
a judged result; ``lifecycle`` derives a task's status from its replicas and locks an
assignment after its task (whose row lock and status moves are ``marketplace.lifecycle``'s);
``control`` stops a node's job that ends without it.
``heldout`` keeps the data no worker receives, ``retention`` how long uploads stay,
``sweep`` moves a worker's earnings to its owner; ``ledger_hooks`` and ``work`` answer
the ledger's and the marketplace's questions about assignments.
"""

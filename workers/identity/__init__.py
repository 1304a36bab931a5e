"""Who a provider node is: registration tokens, proof of key possession, the worker token
that authenticates a node (``authentication``), and suspending, resuming and retiring it
(``services``)."""

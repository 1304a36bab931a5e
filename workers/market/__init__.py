"""The market: providers' asks per kind on each node, the matching rule that pairs waiting
tasks with free nodes by bid and ask, and the order book the market page and the quote
show. The rule and why it was chosen: docs/market.md."""

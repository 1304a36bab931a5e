"""The protocol the platform and provider nodes share, as exact bytes.

Pure Python (no Django, no app import): canonical encoding, ed25519 keys, signing,
bech32 addresses, RFC 6962 Merkle trees and the registration/template wire messages.
The node (``workers/agent/``) signs with it and the platform verifies with it, so the two
can never disagree on an encoding; ``docs/protocol.md`` gives the bytes for third parties.
"""

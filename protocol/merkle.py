"""RFC 6962 Merkle trees: roots, audit paths and offline verification.

Leaf hash = sha256(0x00 ‖ data), node hash = sha256(0x01 ‖ left ‖ right); a tree of n
leaves splits at the largest power of two smaller than n; an odd leaf is never
duplicated; the empty tree hashes to sha256(b""). Pure Python, no Django.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

_sha256 = hashlib.sha256
EMPTY_ROOT = _sha256(b"").digest()
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"


def leaf_hash(data: bytes) -> bytes:
    return _sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return _sha256(NODE_PREFIX + left + right).digest()


def _split(n: int) -> int:
    """Largest power of two strictly smaller than n (n ≥ 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def root_from_leaf_hashes(hashes: Sequence[bytes]) -> bytes:
    """Merkle tree hash over already-hashed leaves.

    Built bottom-up level by level, which yields exactly the RFC 6962 shape: pairing
    left to right and carrying an odd last node up unchanged is the same as splitting at
    the largest power of two. Iterative so that 100,000 leaves cost no recursion.
    """
    if not hashes:
        return EMPTY_ROOT
    level = list(hashes)
    while len(level) > 1:
        nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def root(leaves: Sequence[bytes]) -> bytes:
    """Merkle tree hash of raw leaf data."""
    return root_from_leaf_hashes([leaf_hash(d) for d in leaves])


def audit_path(hashes: Sequence[bytes], index: int) -> list[bytes]:
    """RFC 6962 §2.1.1 PATH(m, D[n]) over leaf hashes: siblings from the leaf upwards."""
    n = len(hashes)
    if not 0 <= index < n:
        raise IndexError(f"leaf {index} is outside a tree of {n}")
    path: list[bytes] = []
    lo, hi, m = 0, n, index
    # Walk down from the root, remembering the sibling subtree at each split.
    siblings: list[bytes] = []
    while hi - lo > 1:
        k = _split(hi - lo)
        if m < k:
            siblings.append(root_from_leaf_hashes(hashes[lo + k : hi]))
            hi = lo + k
        else:
            siblings.append(root_from_leaf_hashes(hashes[lo : lo + k]))
            lo, m = lo + k, m - k
    path.extend(reversed(siblings))
    return path


def root_from_audit_path(leaf: bytes, index: int, size: int, path: Sequence[bytes]) -> bytes:
    """Recompute the root from a leaf hash and its audit path (RFC 9162 §2.1.3.2)."""
    if not 0 <= index < size:
        raise ValueError(f"leaf index {index} is outside a tree of {size}")
    fn, sn = index, size - 1
    r = leaf
    for p in path:
        if len(p) != 32:
            raise ValueError("every audit path element is 32 bytes")
        if sn == 0:
            raise ValueError("the audit path is too long")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ValueError("the audit path is too short")
    return r


def verify_inclusion(leaf: bytes, index: int, size: int, path: Sequence[bytes], expected_root: bytes) -> bool:
    """True when ``leaf`` (a leaf hash) sits at ``index`` of the tree with ``expected_root``."""
    try:
        return root_from_audit_path(leaf, index, size, path) == expected_root
    except ValueError:
        return False

"""RFC 6962 Merkle trees against the certificate-transparency reference vectors."""

from __future__ import annotations

import pytest

from protocol import merkle

# The standard eight-leaf input of the CT / RFC 6962 test data.
LEAVES = [
    bytes.fromhex(h)
    for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f")
]
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
# (leaf index, tree size, audit path) from the CT reference verifier tests.
PATHS = [
    (0, 1, []),
    (
        0,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (
        1,
        5,
        [
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
]


@pytest.mark.parametrize("size", range(9))
def test_roots_match_rfc6962_for_sizes_0_to_8(size: int) -> None:
    assert merkle.root(LEAVES[:size]).hex() == ROOTS[size]


@pytest.mark.parametrize(("index", "size", "path"), PATHS)
def test_audit_paths_match_the_reference_and_verify(index: int, size: int, path: list[str]) -> None:
    hashes = [merkle.leaf_hash(d) for d in LEAVES[:size]]
    got = merkle.audit_path(hashes, index)
    assert [p.hex() for p in got] == path
    assert merkle.verify_inclusion(hashes[index], index, size, got, bytes.fromhex(ROOTS[size]))


def test_every_proof_in_trees_up_to_40_verifies_and_tampering_fails() -> None:
    leaves = [bytes([i, i * 7 % 256]) for i in range(40)]
    for n in range(1, 41):
        hashes = [merkle.leaf_hash(d) for d in leaves[:n]]
        root = merkle.root_from_leaf_hashes(hashes)
        for i in range(n):
            path = merkle.audit_path(hashes, i)
            assert merkle.verify_inclusion(hashes[i], i, n, path, root)
            # Another index, another size, another leaf, a changed or truncated path.
            if n > 1:
                assert not merkle.verify_inclusion(hashes[i], (i + 1) % n, n, path, root)
                assert not merkle.verify_inclusion(hashes[(i + 1) % n], i, n, path, root)
            assert not merkle.verify_inclusion(hashes[i], i, 2 * n, path, root)
            if path:
                bad = [bytes([path[0][0] ^ 1]) + path[0][1:], *path[1:]]
                assert not merkle.verify_inclusion(hashes[i], i, n, bad, root)
                assert not merkle.verify_inclusion(hashes[i], i, n, path[:-1], root)
            assert not merkle.verify_inclusion(hashes[i], i, n, [*path, root], root)


def test_no_duplicated_odd_leaf() -> None:
    # Bitcoin-style duplication would make [a, b, c] and [a, b, c, c] share a root.
    a, b, c = (merkle.leaf_hash(x) for x in (b"a", b"b", b"c"))
    assert merkle.root_from_leaf_hashes([a, b, c]) != merkle.root_from_leaf_hashes([a, b, c, c])


def test_index_outside_the_tree_is_refused() -> None:
    with pytest.raises(IndexError):
        merkle.audit_path([merkle.leaf_hash(b"x")], 1)
    assert not merkle.verify_inclusion(merkle.leaf_hash(b"x"), 0, 0, [], merkle.EMPTY_ROOT)

"""The standard-library Ed25519 public key (peerd/core/ed25519.py) is `cryptography`'s."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from peerd.core.ed25519 import public_key


def test_the_public_key_is_the_one_cryptography_derives() -> None:
    # RFC 8032's first test vector, then random seeds.
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    assert public_key(seed).hex() == "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    for _ in range(20):
        seed = os.urandom(32)
        expected = (
            Ed25519PrivateKey.from_private_bytes(seed)
            .public_key()
            .public_bytes(Encoding.Raw, PublicFormat.Raw)
        )
        assert public_key(seed) == expected


def test_a_seed_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError):
        public_key(b"short")

"""A held request's KV ticket (node/access.py): fixed by (key, request id),
different for another key or another request, and checked by the access
list that granted it."""

from __future__ import annotations

import pytest

from connector.transport import KVAccessDenied, UnknownRequestError
from node.access import AccessList, make_ticket


def test_a_ticket_depends_on_the_key_and_the_request_and_on_nothing_else():
    key = bytes(range(32))
    assert make_ticket(key, "r1") == make_ticket(key, "r1")
    assert len(make_ticket(key, "r1")) == 32 and int(make_ticket(key, "r1"), 16) >= 0
    assert make_ticket(key, "r1") != make_ticket(key, "r2")
    assert make_ticket(key, "r1") != make_ticket(bytes(32), "r1")
    # Keys of any length work (BLAKE2b's own limit is 64 bytes).
    assert make_ticket(b"", "r1") != make_ticket(b"k" * 100, "r1") != make_ticket(b"k" * 101, "r1")


def test_the_access_list_binds_the_first_consumer_with_the_ticket():
    access = AccessList(b"node-key")
    ticket = access.grant("r")
    assert ticket == make_ticket(b"node-key", "r")
    with pytest.raises(KVAccessDenied):
        access.check("r", make_ticket(b"other-key", "r"), "decode-0")
    access.check("r", ticket, "decode-0")
    with pytest.raises(KVAccessDenied):
        access.check("r", ticket, "decode-1")  # bound to decode-0
    access.release("r")
    access.check("r", ticket, "decode-0")  # a repeated done report after the release
    with pytest.raises(UnknownRequestError):
        access.check("never-held", ticket, "decode-0")

"""Hostile request bodies get a 400 (or 413) in OpenAI's error shape, never a
500 with a traceback (issue 34, finding 6): a 5,000-digit max_tokens or
priority, JSON nested 5k levels, an unknown field with a 1 MB name (not
echoed back), a body past the size limit, `include_usage: "yes"`."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from .conftest import MODEL


def post(server, body: bytes) -> tuple[int, dict, str]:
    request = urllib.request.Request(
        server.base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read()), resp.headers.get_content_type()
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers.get_content_type()


def completion(**fields) -> str:
    return json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2, **fields})


@pytest.mark.parametrize(
    "body, words",
    [
        (completion().replace('"max_tokens": 2', '"max_tokens": ' + "9" * 5000), "digits"),
        (completion().replace('"max_tokens": 2', '"max_tokens": 2, "priority": ' + "9" * 5000), "digits"),
        (completion().replace('"prompt": "x"', '"prompt": ' + "[" * 5000 + "]" * 5000), "nested too deeply"),
        (completion(stream=True, stream_options={"include_usage": "yes"}), "stream_options is invalid"),
    ],
)
def test_hostile_bodies_are_400_in_openais_shape(server, body, words):
    status, reply, content_type = post(server, body.encode())
    assert (status, content_type) == (400, "application/json")
    assert reply["error"]["code"] == 400 and reply["error"]["type"] == "invalid_request_error"
    assert words in reply["error"]["message"]


def test_an_unknown_field_with_a_huge_name_is_not_echoed(server):
    name = "x" * (1 << 20)
    status, reply, _ = post(server, completion(**{name: 1}).encode())
    assert status == 400
    assert len(json.dumps(reply)) < 1000  # message and param cut to a few dozen characters
    assert reply["error"]["param"] == "x" * 40


def test_a_body_past_the_limit_is_a_json_413(server):
    status, reply, content_type = post(server, completion(prompt="a " * (5 << 20)).encode())
    assert (status, content_type) == (413, "application/json")
    assert reply["error"]["code"] == 413 and "larger than" in reply["error"]["message"]

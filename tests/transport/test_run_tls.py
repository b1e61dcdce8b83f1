"""The KV handoff's TLS made per run (cluster/wall/tls.py): a pull over it
lands; a client of another run (another CA) or without TLS is refused; and
when TLS is on (`cluster.tls`), or given by files."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster.wall.tls import SERVER_NAME, TLS_FILES_ENV, kv_tls_for_run, run_kv_tls, tls_wanted
from connector.grpc.client import KVPuller
from connector.grpc.security import KVSecurity
from connector.grpc.server import KVHandoffServer
from connector.pull_policy import PullFailure
from tests.transport.test_grpc_security import SECURE, TOKEN, GuardedSource, attempt, run


def test_a_pull_over_the_runs_own_tls_lands_and_other_runs_are_refused():
    tls, other = run_kv_tls(), run_kv_tls()
    assert tls.server_name == SERVER_NAME and tls.root_certificates != other.root_certificates
    source = GuardedSource()
    ticket = source.hold("r1", 2)

    async def body():
        async with KVHandoffServer(source, security=replace(tls, auth_token=TOKEN)) as server:
            outcomes = []
            for security in (replace(tls, auth_token=TOKEN), replace(other, auth_token=TOKEN), SECURE):
                async with KVPuller(security=security) as puller:
                    outcomes.append(await puller.attempt(attempt("r1", server.address, ticket=ticket), lambda *a: None))
            return outcomes

    ok, other_ca, plain = run(body())
    assert ok.failure is None and ok.landed == (0, 1)
    assert other_ca.failure is PullFailure.PRODUCER_UNAVAILABLE  # its CA does not vouch for this server
    assert plain.failure is PullFailure.PRODUCER_UNAVAILABLE


@pytest.mark.parametrize(
    "mode,attached,on", [("auto", False, False), ("auto", True, True), ("on", False, True), ("off", True, False)]
)
def test_tls_is_on_when_attached_unless_turned_off(mode, attached, on):
    assert tls_wanted(mode, attached) is on
    security, note = kv_tls_for_run(mode, attached, environ={})
    assert (security is not None) is on and note.startswith("on" if on else "off")


def test_given_certificate_files_are_used_all_four_or_none(tmp_path):
    made = run_kv_tls()
    files = {}
    for name, data in (("cert", made.cert_chain), ("key", made.private_key), ("ca", made.root_certificates)):
        (tmp_path / name).write_bytes(data)
        files[name] = str(tmp_path / name)
    env = dict(zip(TLS_FILES_ENV, (files["cert"], files["key"], files["ca"], SERVER_NAME), strict=True))
    security, note = kv_tls_for_run("auto", True, environ=env)
    assert security == KVSecurity(
        cert_chain=made.cert_chain, private_key=made.private_key, root_certificates=made.root_certificates,
        server_name=SERVER_NAME,
    )  # fmt: skip
    assert note == f"on (cluster.tls=auto; certificates from {files['cert']})"
    with pytest.raises(ValueError, match="DISAGG_SIM_KV_TLS_NAME not set; allowed: all of"):
        kv_tls_for_run("on", False, environ={k: v for k, v in env.items() if not k.endswith("NAME")})
    (tmp_path / "ca").write_text("not a certificate")
    with pytest.raises(ValueError, match="root_certificates=.*not a PEM file"):
        kv_tls_for_run("on", False, environ=env)


def test_framed_links_carry_frames_over_the_runs_tls_and_refuse_others():
    """The proxy channel's and stage links' framing (cluster/wall/frames.py) with the run's certificates."""
    import asyncio
    import ssl

    from cluster.wall.frames import FrameConnection, serve

    tls, other = run_kv_tls(), run_kv_tls()
    got = []

    async def on_connection(conn):
        got.append(await conn.recv())
        conn.send(["ok"])
        await conn.recv()  # until the client closes

    async def body():
        server, port = await serve("127.0.0.1", on_connection, tls=tls)
        try:
            conn = await FrameConnection.open("127.0.0.1", port, tls=tls)
            conn.send(["hello", "decode-0"])
            reply = await conn.recv()
            await conn.close()
            with pytest.raises(ssl.SSLCertVerificationError):
                await FrameConnection.open("127.0.0.1", port, tls=other)  # another run's CA
            plain = await FrameConnection.open("127.0.0.1", port)  # no TLS: no frame gets through
            plain.send(["hello", "stranger"])
            stranger = await asyncio.wait_for(plain.recv(), 5)
            await plain.close()
            return reply, stranger
        finally:
            server.close()
            await server.wait_closed()

    reply, stranger = asyncio.run(body())
    assert reply == ["ok"] and got[0] == ["hello", "decode-0"]
    assert stranger is None and ["hello", "stranger"] not in got

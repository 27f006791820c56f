"""How a trainer process finds the Proxy's TransferQueue: ``GET /transfer_queue/spec`` (admin token, the
spec a read's ``meta_info`` carries; 409 without TQ), ``ProxyTrajectorySource.transfer_queue_spec()``,
and the spec file ``--transfer-queue-spec-out`` writes for the Proxy's lifetime."""

from __future__ import annotations

import os
import stat

import httpx
import numpy as np
import pytest

from dressage.errors import ConfigError, NoTransferQueueError, ProxyStatusError
from dressage.harness.run.config import RunConfig
from dressage.proxy.config import DataPlaneConfig, EnginesConfig, ProxyConfig, TransferQueueSelection
from dressage.proxy.deployment import Proxy
from dressage.fields import get_model
from dressage.testing.stack import TEST_MODEL
from dressage.tq.client.spec import load_client_spec
from dressage.train.remote import ProxyTrajectorySource

AGENT, ADMIN = "agent-secret", "admin-secret"


def test_the_spec_is_an_admin_endpoint_and_is_what_a_read_hands_out(engine, tq, proxy_stack):
    proxy = proxy_stack(engine.url, tq=tq, api_token=AGENT, admin_token=ADMIN)
    url = proxy.url + "/transfer_queue/spec"
    assert httpx.get(url).status_code == 401
    denied = httpx.get(url, headers={"authorization": f"Bearer {AGENT}"})
    assert denied.status_code == 403 and denied.json()["error"]["type"] == "permission_error"
    answer = httpx.get(url, headers={"authorization": f"Bearer {ADMIN}"})
    assert answer.status_code == 200
    spec = answer.json()
    assert spec == tq.client_spec() and spec["auth_secret"]  # the secret: why only the admin token gets it
    read = httpx.post(proxy.url + "/trajectory/read", json={"format": "samples", "drain": False},
                      headers={"authorization": f"Bearer {ADMIN}"}).json()
    assert read["meta_info"]["transfer_queue"] == spec

    # The trainer's client: the spec without reading a trajectory, and a TQ client joined from it.
    source = ProxyTrajectorySource(proxy.url, token=ADMIN)
    assert source.transfer_queue_spec() == spec
    fresh = ProxyTrajectorySource(proxy.url, token=ADMIN)
    try:
        client = fresh.client()  # no read before: it asks for the spec
        ref = client.put("logprobs", np.zeros(4, np.float32))
        assert tq.client().total_keys() == 1
        client.delete([ref.key])
        assert tq.client().total_keys() == 0
    finally:
        fresh.close()
    with pytest.raises(ProxyStatusError) as info:
        ProxyTrajectorySource(proxy.url, token=AGENT).transfer_queue_spec()
    assert info.value.status_code == 403


def test_a_proxy_without_transfer_queue_answers_409_naming_the_flag(engine, proxy_stack):
    proxy = proxy_stack(engine.url)
    answer = httpx.get(proxy.url + "/transfer_queue/spec")
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "no_transfer_queue" and "--enable-transfer-queue" in error["message"]
    source = ProxyTrajectorySource(proxy.url)
    with pytest.raises(NoTransferQueueError, match="runs without TransferQueue"):
        source.transfer_queue_spec()
    with pytest.raises(NoTransferQueueError):
        source.client()


def _config(engine_url: str, spec_out: str) -> ProxyConfig:
    return ProxyConfig(engines=EnginesConfig(engine_urls=(engine_url,), skip_engine_check=True),
                       data_plane=DataPlaneConfig(model=get_model(TEST_MODEL), enable_transfer_queue=True),
                       transfer_queue=TransferQueueSelection(config={"deployment": "embedded"}, spec_out=spec_out))


def test_spec_out_writes_the_proxys_spec_for_its_lifetime(engine, tmp_path):
    path = tmp_path / "tq-spec.json"
    with Proxy.start(_config(engine.url, str(path))) as proxy:
        assert proxy.spec_file == str(path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # it carries the TQ's secret
        served = ProxyTrajectorySource(proxy.url).transfer_queue_spec()
        assert load_client_spec(path) == served == proxy.tq.client_spec()
    assert not path.exists()  # the TQ it named stopped with the Proxy


def test_spec_out_is_refused_where_it_cannot_be_honoured(engine, tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match=r"transfer_queue\.spec_out \(--transfer-queue-spec-out\)"):
        Proxy.start(_config(engine.url, str(tmp_path / "a-file" / "tq.json")))  # no directory can be made there
    with pytest.raises(ConfigError, match=r"transfer_queue\.spec_out .*enable_transfer_queue .* is off"):
        ProxyConfig(transfer_queue=TransferQueueSelection(spec_out="tq.json"))
    with pytest.raises(ConfigError, match="names the file transfer_queue.spec"):
        TransferQueueSelection(spec="tq.json", spec_out="./tq.json")
    with pytest.raises(ConfigError, match="spec_out: expected a file path"):
        TransferQueueSelection(spec_out="")
    with pytest.raises(ConfigError, match="dressage run"):
        RunConfig(transfer_queue=TransferQueueSelection(spec_out="tq.json"))

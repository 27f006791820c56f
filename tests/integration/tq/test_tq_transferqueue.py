"""``deployment: transferqueue``: Steps stored in a public TransferQueue (PyPI ``transferqueue``) on a local
Ray, in upstream Dressage's key, partition, column and tag layout; the StorageUnit suite runs against it."""

import time
import uuid

import numpy as np
import pytest

from dressage.errors import ConfigError, KeyNotFoundError
from dressage.testing import StorageUnitTests
from dressage.tq import TransferQueue
from dressage.tq.config import TransferQueueConfig, TransferQueueSelection
from dressage.tq.storage.kv import KVStorageUnit, kv_location, step_partition

ray = pytest.importorskip("ray")
tq_api = pytest.importorskip("transfer_queue")

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def public_tq():
    """One local Ray and one public TransferQueue for the module (a deployment joins it, as a Proxy
    joins the TransferQueue a trainer started)."""
    from omegaconf import OmegaConf

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tq_api.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        yield tq_api
        tq_api.close()
    finally:
        ray.shutdown()


def _rows(store_id):
    return tq_api.kv_list(partition_id=step_partition(store_id)).get(step_partition(store_id), {})


class TestKVStorageUnit(StorageUnitTests):
    def make_unit(self, memory_budget):
        return KVStorageUnit("kv0", store_id=uuid.uuid4().hex[:8], memory_budget=memory_budget, retention_s=60)


def test_step_keys_map_to_upstream_rows_columns_and_tags():
    loc = kv_location("run", "sess-1/a1b2c3.4/routed_experts")
    assert (loc.kv_key, loc.column) == ("run:sess-1:a1b2c3:step:4", "response_routed_experts_chunks")
    assert loc.tag == {"trajectory_id": "sess-1", "incarnation_id": "a1b2c3"}
    assert kv_location("run", "sess-1/a1b2c3.4/logprobs").column == "response_logprobs"
    other = kv_location("run", "abc-7")
    assert (other.kv_key, other.column, other.tag) == ("run:abc-7", "value", {})
    # A call index written differently is another key, so it must not share the Step's row.
    assert kv_location("run", "sess-1/a1b2c3.04/logprobs").kv_key == "run:sess-1/a1b2c3.04/logprobs"
    # ProxyCore's incarnation: its epoch and the session id's life within it (a row per life of the id)
    lives = [kv_location("run", f"sess-1/0a1b2c3d4e5f-{life}.4/logprobs") for life in (0, 1)]
    assert [loc.kv_key for loc in lives] == ["run:sess-1:0a1b2c3d4e5f-0:step:4", "run:sess-1:0a1b2c3d4e5f-1:step:4"]
    assert lives[1].tag == {"trajectory_id": "sess-1", "incarnation_id": "0a1b2c3d4e5f-1"}


def test_store_id_is_checked_at_the_edge():
    with pytest.raises(ConfigError, match="store_id"):
        TransferQueueConfig(deployment="transferqueue", store_id="a:b")


def test_a_step_is_one_upstream_row_readable_the_way_upstreams_hydration_reads_it():
    store = "s" + uuid.uuid4().hex[:8]
    with TransferQueue.start({"deployment": "transferqueue", "store_id": store, "retention_s": 600}) as tq:
        client = tq.client()
        lp = np.linspace(-2, 0, 6, dtype=np.float32)
        r3 = np.arange(7 * 4 * 2, dtype=np.uint8).reshape(7, 4, 2)
        before = time.time()
        refs = client.put_many([("logprobs", lp), ("routed_experts", r3)], batch="step-0",
                               keys=["traj-9/ab12cd.3/logprobs", "traj-9/ab12cd.3/routed_experts"])
        rows = _rows(store)
        assert list(rows) == [f"{store}:traj-9:ab12cd:step:3"]
        tag = rows[f"{store}:traj-9:ab12cd:step:3"]
        assert tag["trajectory_id"] == "traj-9" and tag["incarnation_id"] == "ab12cd"
        assert before + 600 <= tag["expires_at"] <= time.time() + 600
        # Upstream's trainer: one kv_batch_get per column, logprobs a float tensor, R3 a list of chunks.
        data = tq_api.kv_batch_get(keys=[f"{store}:traj-9:ab12cd:step:3"], partition_id=step_partition(store),
                                   select_fields=["response_logprobs", "response_routed_experts_chunks"])
        np.testing.assert_array_equal(data["response_logprobs"][0].numpy(), lp)
        chunks = getattr(data["response_routed_experts_chunks"][0], "data",
                         data["response_routed_experts_chunks"][0])
        assert [(c["row_count"], c["dtype"]) for c in chunks] == [(7, "uint8")]
        np.testing.assert_array_equal(np.asarray(chunks[0]["data"]).reshape(7, 8), r3.reshape(7, 8))
        # Our own reader: same dtype, shape, values, and only the rows a ref names.
        got = client.get_many([refs[1], refs[0], refs[1].narrow(2, 5)])
        np.testing.assert_array_equal(got[0], r3)
        assert got[0].dtype == np.uint8
        np.testing.assert_array_equal(got[1], lp)
        np.testing.assert_array_equal(got[2], r3[2:5])
        assert client.clear("step-0") == 2
        assert _rows(store) == {} and tq.total_keys() == 0
        with pytest.raises(KeyNotFoundError):
            client.get_many([refs[0]])


def test_retention_sweep_clears_expired_rows_whoever_wrote_them():
    store = "s" + uuid.uuid4().hex[:8]
    with TransferQueue.start({"deployment": "transferqueue", "store_id": store, "retention_s": 3600}) as tq:
        client = tq.client()
        live = client.put("logprobs", np.zeros(3, dtype=np.float32), key="t/e0.0/logprobs")
        # A row a Proxy that died left behind, its expiry passed.
        import torch

        tq_api.kv_put(key=f"{store}:gone:e1:step:0", partition_id=step_partition(store),
                      fields={"response_logprobs": torch.zeros(2)}, tag={"expires_at": time.time() - 1})
        assert tq.run_janitor() == 1
        assert list(_rows(store)) == [f"{store}:t:e0:step:0"]
        np.testing.assert_array_equal(client.get(live), np.zeros(3))
        # Our own rows expire as well once their tag says so.
        assert tq._deployment.unit.sweep_expired(now=time.time() + 7200) == 1
        assert _rows(store) == {} and tq.total_keys() == 0


def test_a_run_gives_the_same_samples_as_tq_off_in_upstreams_layout_and_leaves_no_row(monkeypatch):
    from dressage.dataplane import DataPlaneConfig
    from dressage.fields import get_model
    from dressage.harness.run import RunConfig, run_pipeline
    from dressage.harness.run.config import AgentsConfig, InferenceConfig, ReportConfig, RolloutConfig
    from dressage.tq import load_config

    def _cfg(tq, **kw):
        dp = DataPlaneConfig(model=get_model("qwen3.6-35b-a3b"), use_rollout_routing_replay=True,
                             enable_transfer_queue=tq, routed_experts_dtype="uint8")
        return RunConfig(data_plane=dp, seed=7, report=ReportConfig(progress=False),
                         rollout=RolloutConfig(num_rollouts=1, rollout_batch_size=3, n_samples_per_prompt=2),
                         agents=AgentsConfig(max_turns=3, max_tokens=48, retry_rate=0.3),
                         inference=InferenceConfig(mean_response_tokens=24, tool_call_rate=0.5), **kw)

    puts = []
    real_put = tq_api.kv_put

    listed = []

    def spy(**kw):
        puts.append((kw["key"], kw["partition_id"], sorted(kw["fields"]), dict(kw["tag"])))
        out = real_put(**kw)
        if not listed:  # the row as kv_list shows it while the run holds it
            listed.append(tq_api.kv_list(partition_id=kw["partition_id"])[kw["partition_id"]].get(kw["key"]))
        return out

    monkeypatch.setattr(tq_api, "kv_put", spy)
    store = "run" + uuid.uuid4().hex[:6]
    off = run_pipeline(_cfg(False))
    on = run_pipeline(_cfg(True, transfer_queue=TransferQueueSelection(
        config=load_config({"deployment": "transferqueue", "store_id": store}))))
    assert on.samples_digest == off.samples_digest
    assert on.tq_keys_left == 0
    assert _rows(store) == {}
    assert puts and {p[1] for p in puts} == {f"dressage:{store}:steps"}
    assert listed[0] is not None and listed[0]["trajectory_id"] == puts[0][3]["trajectory_id"]
    for key, _, columns, tag in puts:
        parts = key.split(":")
        assert len(parts) == 5 and parts[0] == store and parts[3] == "step" and parts[4].isdigit()
        assert (parts[1], parts[2]) == (tag["trajectory_id"], tag["incarnation_id"])
        assert set(columns) <= {"response_logprobs", "response_routed_experts_chunks"}
    assert {c for p in puts for c in p[2]} == {"response_logprobs", "response_routed_experts_chunks"}


def test_a_reader_joining_with_the_client_spec_restores_rows_over_zmq():
    from dressage.tq import TransferQueueClient

    store = "s" + uuid.uuid4().hex[:8]
    with TransferQueue.start({"deployment": "transferqueue", "store_id": store}) as tq:
        r3 = np.arange(5 * 2 * 2, dtype=np.uint16).reshape(5, 2, 2) * 300
        ref = tq.client().put("routed_experts", r3, batch="b", key="t/e0.0/routed_experts")
        with TransferQueueClient.connect(tq.client_spec()) as reader:
            got = reader.get_many([ref, ref.narrow(1, 3)], consume=True)
            np.testing.assert_array_equal(got[0], r3)
            np.testing.assert_array_equal(got[1], r3[1:3])
            assert reader.clear("b") == 1
        assert _rows(store) == {} and tq.total_keys() == 0


def test_expired_rows_are_swept_in_the_background():
    import torch

    store = "s" + uuid.uuid4().hex[:8]
    with TransferQueue.start({"deployment": "transferqueue", "store_id": store, "retention_s": 5}):
        # Only the tag sweep can clear this row: our Controller never saw its key.
        tq_api.kv_put(key=f"{store}:gone:e1:step:0", partition_id=step_partition(store),
                      fields={"response_logprobs": torch.zeros(2)}, tag={"expires_at": time.time() - 1})
        assert list(_rows(store)) == [f"{store}:gone:e1:step:0"]
        for _ in range(300):  # the sweep runs every second here
            if not _rows(store):
                break
            time.sleep(0.1)
        assert _rows(store) == {}


def test_upstream_field_refs_name_the_row_and_column_of_a_key():
    from dressage.tq.storage.kv import upstream_field_ref

    assert upstream_field_ref("run", "sess/ab12.2/logprobs") == {
        "schema_version": "dressage.tq.field-ref.v1", "store_id": "run", "partition": "dressage:run:steps",
        "key": "run:sess:ab12:step:2", "field": "response_logprobs", "incarnation_id": "ab12"}

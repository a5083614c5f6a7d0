"""A combiner sends each round's model to its switch once, whatever the number of its clients
(`Messenger.send_model_to`, `nebula.wire.share`): real controller, combiner and client processes through real
switches, a model too large to travel inside the task's message."""
from __future__ import annotations

from nebula.federated.controller.trail import ModelTrail
from testbed.fedjob import federation, run_job, write_job
from testbed.federation import slot_bytes

DIM = 100_000  # the toy model's w is DIM x 3 float32 (1.2 MB): sent as pieces after the task, not inside it
CLIENTS, ROUNDS = 3, 2


def test_each_rounds_model_reaches_the_combiners_switch_once(procs, tmp_path):
    workers = federation(procs, tmp_path)
    job = write_job(tmp_path, workers, {"B": CLIENTS}, rounds=ROUNDS, validity={"min_updates": CLIENTS},
                    client={"factory": "testbed.toy_client:make_client", "args": {"dim": DIM, "n": 16}})
    run_job(procs, job)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        rounds = t.rounds()
    assert [r.status for r in rounds] == ["valid"] * ROUNDS and all(r.num_updates == CLIENTS for r in rounds)
    # switch B's count of the model's bytes: put into the combiner's slots once a round, taken from them for every
    # other client (w's pieces only: b's 12 bytes are not worth a slot)
    shared = DIM * 3 * 4
    got = slot_bytes(tmp_path / "prov" / "B" / "switch.yaml", used=ROUNDS * (CLIENTS - 1) * shared)
    assert got == {"put": ROUNDS * shared, "used": ROUNDS * (CLIENTS - 1) * shared}

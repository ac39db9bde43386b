"""`copy_ceiling.py`: each kernel's byte structure is moved right by the Triton mover (real
kernels under the interpreter) on one tile a program and on a persistent grid, the check
catches a mover that leaves elements out, input sets share outputs only when asked, shapes and
bars are read as given, a whole run goes through under the interpreter (every candidate checked
and timed, the table's pick both ways), and a run's JSON is drawn again without a GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from copy_ceiling import (
    MOVES,
    Mover,
    bar,
    check,
    main,
    movers,
    parse_shapes,
    rotation,
    tensors,
    torch_copy,
)
from kerneltune.kernels import REGISTRY
from kerneltune.table import INTERPRETER_DEVICE, Entry, Table
from kerneltune.table import save as save_table

#: Tiles of 64 over 3 x 100 elements: a masked last tile, one tile a program and loops of
#: several tiles a program (the interpreter's grid has four "SMs").
MOVERS = [Mover(64, 1, 0, False), Mover(64, 1, 1, False), Mover(128, 2, 2, False)]


@pytest.mark.parametrize("kernel", sorted(MOVES))
@pytest.mark.parametrize("mover", [*MOVERS, torch_copy], ids=lambda m: getattr(m, "name", "torch"))
def test_each_mover_writes_the_kernels_bytes(kernel, mover):
    check(mover, *tensors(kernel, 3, 100, torch.bfloat16, torch.device("cpu")))


def test_check_catches_a_mover_that_skips_the_last_tile():
    def short(inputs, outputs):
        Mover(64, 1, 0, False)([t.view(-1)[:64] for t in inputs],
                               [t.view(-1)[:64] for t in outputs])

    with pytest.raises(AssertionError, match="elements differ"):
        check(short, *tensors("rmsnorm_quant_fwd", 3, 100, torch.bfloat16, torch.device("cpu")))


def test_the_int8_output_is_written_a_byte_each():
    inputs, outputs = tensors("rmsnorm_quant_fwd", 2, 64, torch.bfloat16, torch.device("cpu"))
    assert outputs[0].dtype == torch.int8 and len(inputs) == 1


def test_shapes_and_bars():
    assert parse_shapes("rmsnorm_fwd:4096x5120,rmsnorm_bwd:16x1024") == [
        ("rmsnorm_fwd", 4096, 5120), ("rmsnorm_bwd", 16, 1024)]
    with pytest.raises(ValueError, match="rmsnorm_fwd"):
        parse_shapes("rmsnorm:4096x1024")
    with pytest.raises(ValueError, match="KERNEL:MxN"):
        parse_shapes("rmsnorm_fwd:4096")
    assert [bar("rmsnorm_fwd", m) for m in (256, 2048, 4096, 16384)] == [None, 0.85, 0.9, 0.9]
    assert bar("rmsnorm_quant_fwd", 2048) is None and bar("rmsnorm_quant_fwd", 4096) == 0.85


@pytest.mark.parametrize("shared", [False, True])
def test_sets_rotate_their_inputs_and_share_outputs_only_when_asked(shared):
    sets = rotation("add_rmsnorm_fwd", 2, 64, torch.bfloat16, torch.device("cpu"), 3, shared)
    inputs = [t.data_ptr() for ins, _ in sets for t in ins]
    outputs = [tuple(t.data_ptr() for t in outs) for _, outs in sets]
    assert len(set(inputs)) == 6
    assert len(set(outputs)) == (1 if shared else 3)
    for ins, outs in sets:
        check(Mover(64, 1, 0, False), ins, outs)


def test_replot_draws_movers_and_kernels_from_a_run(tmp_path):
    """A run's JSON (movers at both output modes, the kernel both ways) drawn again, no GPU."""
    best = {"impl": "triton 4096/16w/a tile each/pdl", "gpu_us": 4.5, "frac_copy": 0.93}
    shape = {"kernel": "rmsnorm_quant_fwd", "m": 4096, "n": 1024, "bar": 0.85}
    kernel = [{"impl": f"kerneltune, outputs {how}", "gpu_us": us, "frac_copy": frac}
              for how, us, frac in (("freed each call", 5.7, 0.73), ("kept", 6.8, 0.61))]
    out = tmp_path / "run.json"
    out.write_text(json.dumps({"device": "GPU", "shapes": [
        {**shape, "outputs": "rotating", "best": best, "rows": [best]},
        {**shape, "outputs": "shared", "best": best, "rows": [best]},
        {**shape, "rows": kernel}]}))
    main([str(out), "--replot"])
    assert (tmp_path / "run.png").stat().st_size > 10_000
    with pytest.raises(SystemExit):
        main([str(tmp_path / "new.json")])  # measuring needs --shapes


def test_a_run_under_the_interpreter_checks_and_times_every_candidate(tmp_path, capsys):
    fwd = REGISTRY["rmsnorm_fwd"]
    problem = fwd.problem(2, 64)
    pick = fwd.default(problem).replace(num_warps=1)
    table = save_table(Table(INTERPRETER_DEVICE, entries=[
        Entry("rmsnorm_fwd", "bfloat16", n=64, m=2, config=pick.to_json(), us=1.0, gbps=1.0,
              default_us=1.0, trials=1, kernel_hash=fwd.kernel_hash)]), tmp_path / "t.json")
    out = tmp_path / "run.json"
    main([str(out), "--shapes", "rmsnorm_fwd:2x64,rmsnorm_quant_fwd:4096x2", "--outputs",
          "both", "--table", str(table)])
    data = json.loads(out.read_text())
    assert data["device"] == INTERPRETER_DEVICE and data["copy_gbps"] is None
    movers_run = data["shapes"][:2] + data["shapes"][3:5]
    assert [(r["kernel"], r["outputs"]) for r in movers_run] == [
        ("rmsnorm_fwd", "rotating"), ("rmsnorm_fwd", "shared"),
        ("rmsnorm_quant_fwd", "rotating"), ("rmsnorm_quant_fwd", "shared")]
    names = ["torch copy_", *(m.name for m in movers(torch.device("cpu")))]
    for r in movers_run:
        assert [row["impl"] for row in r["rows"]] == names  # every candidate passed its check
        assert all(row["gpu_us"] > 0 for row in r["rows"])
        assert r["best"] == min(r["rows"], key=lambda row: row["gpu_us"])
    assert movers_run[2]["bar"] == 0.85 and movers_run[0]["bar"] is None
    assert movers_run[0]["bytes"] == fwd.bytes_moved(problem)
    # the table's pick where it has one (4096 x 2 of quant: the default), timed both ways
    fwd_kernel, quant_kernel = data["shapes"][2], data["shapes"][5]
    assert [row["config"] for row in fwd_kernel["rows"]] == [pick.to_json()] * 2
    quant = REGISTRY["rmsnorm_quant_fwd"]
    assert quant_kernel["rows"][0]["config"] == quant.default(
        quant.problem(4096, 2, quant="int8")).to_json()
    assert [row["impl"] for row in fwd_kernel["rows"]] == [
        "kerneltune, outputs freed each call", "kerneltune, outputs kept"]
    assert not out.with_suffix(".png").exists()  # fractions of copy need a GPU
    assert "copy not measured" in capsys.readouterr().out

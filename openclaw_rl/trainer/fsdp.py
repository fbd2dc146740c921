"""``training.backend = "fsdp"``: the same PPO trainer, data-parallel and sharded over processes.

Why a subclass and not a second trainer: the losses, the micro-batching, the scoring passes, the
reference policy and the export format are exactly :class:`~openclaw_rl.trainer.ppo.Trainer`'s.
What changes under ``torch.distributed`` is only *where* each piece runs:

* the model is wrapped with FSDP2 (``fully_shard``: one unit per decoder layer, plus the root), so
  parameters, gradients and AdamW state are sharded over the processes (gloo on CPU, nccl on GPU);
* each mini-batch is split over the processes (length-balanced); every process uses the *global*
  mini-batch token count as the loss denominator and scales its loss by the world size, because
  FSDP averages gradients over processes — the resulting step is the single-process step on the
  whole mini-batch (up to float summation order);
* FSDP's forward and backward are collectives, so every process must run the same number of them:
  a process with fewer micro-batches runs zero-weighted dummy ones;
* checkpoints are ``torch.distributed.checkpoint`` (DCP) shards, which load on a *different*
  process count (DCP reshards on load); each checkpoint also holds the gathered policy export,
  as the single-process trainer writes it. Every rank writes into one temporary directory (named
  by rank 0); rank 0 alone puts it in place, moves ``latest`` and prunes, through the same
  :class:`~openclaw_rl.trainer.checkpoint.Publication` as the single-process trainer.

Who drives: rank 0 runs the ordinary :class:`~openclaw_rl.trainer.loop.TrainingLoop` (store, metrics,
weight publication — one writer of everything). Its trainer methods that need every process
(``train_update``, ``export_policy``, ``save_checkpoint``, ``resume``) first broadcast the call and its
arguments (the samples themselves) on a gloo control group; ranks > 0 sit in :meth:`FSDPTrainer.follow`
and execute the same call. Nothing but rank 0 touches the store.

Launching: ``python -m openclaw_rl.trainer.fsdp --config FILE --policy-url URL`` starts
``[training] num_processes`` processes with ``torch.multiprocessing`` (:func:`spawn`), or, started by
``torchrun``, uses the process group torchrun set up. See docs/scaling.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor

from openclaw_rl.config import Config, load_config
from openclaw_rl.runtime.ports import free_port
from openclaw_rl.trainer.checkpoint import STATE_FILE, Publication, checkpoint_name, config_mismatch
from openclaw_rl.trainer.loop import TrainingLoop
from openclaw_rl.trainer.ppo import POLICY_SUBDIR, Trainer, micro_batches
from openclaw_rl.types import Sample

DCP_SUBDIR = "dcp"
# The control group waits for rank 0's next command for as long as the run idles (a personal-agent
# run can go hours without a batch); a dead rank 0 is caught by the process launcher, not a timeout.
CONTROL_TIMEOUT = timedelta(days=30)
# Collectives inside one command (forward, backward, checkpoint) finish in minutes or are stuck.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks (``*DecoderLayer``): one FSDP unit each, so one is gathered at a time."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


class FSDPTrainer(Trainer):
    """:class:`Trainer` under FSDP. Construct it on *every* process after the process group exists.

    Rank 0 calls the usual methods; ranks > 0 call :meth:`follow` (returns when rank 0 calls
    :meth:`release_followers`). With one process it is a plain trainer that writes DCP checkpoints.
    """

    def __init__(self, cfg: Config, model_name_or_dir: str):
        if not dist.is_initialized():
            raise RuntimeError(
                "FSDPTrainer needs torch.distributed initialised; start it through "
                "openclaw_rl.trainer.fsdp.spawn or torchrun"
            )
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if cfg.training.backend != "fsdp":
            raise ValueError(
                f'[training] backend = {cfg.training.backend!r}: FSDPTrainer is backend = "fsdp"'
            )
        self.rank, self.world = _rank(), _world()
        # The base class builds the model on one device: on GPU, this process's cuda:<local rank>.
        device = cfg.training.device
        if device.startswith("cuda"):
            local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(local_rank)
        super().__init__(cfg, model_name_or_dir, device=device)
        mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (self.world,))
        # Every rank initialised the same weights (same seed), so sharding them needs no broadcast.
        # Only the decoder layers are sharded (each its own FSDP unit, resharded after its forward):
        # logprobs.py runs the decoder and then applies the LM head weight *outside* any module
        # forward, which an FSDP root around the whole model would leave sharded at that moment.
        # The embedding / final norm / head stay replicated; with LoRA they are frozen, with full
        # training their gradients are averaged by hand (_sync_replicated_grads).
        for module in (self.model, self.ref_model):
            if module is None:
                continue
            layers = _decoder_layers(module)
            if not layers:
                raise ValueError(f"{type(module).__name__}: no *DecoderLayer modules found to shard")
            for layer in layers:
                fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self._replicated = [p for p in self.params if not hasattr(p, "full_tensor")]
        # The optimizer must hold the sharded (DTensor) parameters, so it is rebuilt after wrapping.
        self.optimizer = torch.optim.AdamW(self.params, lr=self.tc.lr)
        self._ctrl = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        self._depth = 0  # >0 while executing a command: nested calls must not broadcast again

    # ------------------------------------------------------------------ command broadcast

    @contextmanager
    def _collective(self, name: str, *args: Any) -> Iterator[None]:
        """Rank 0, outermost call: tell the followers to run ``name(*args)`` too."""
        if self.rank == 0 and self._depth == 0 and self.world > 1:
            dist.broadcast_object_list([(name, args)], src=0, group=self._ctrl)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def follow(self) -> None:
        """Ranks > 0: execute rank 0's commands until it calls :meth:`release_followers`."""
        if self.rank == 0:
            raise RuntimeError("rank 0 drives; only ranks > 0 follow")
        self._depth = 1
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0, group=self._ctrl)
            name, args = box[0]
            if name == "stop":
                return
            if name not in ("train_update", "export_policy", "save_checkpoint", "resume"):
                raise RuntimeError(f"unknown trainer command from rank 0: {name!r}")
            getattr(self, name)(*args)

    def release_followers(self) -> None:
        """Rank 0: let the followers' :meth:`follow` return (end of the run)."""
        if self.rank == 0 and self.world > 1:
            dist.broadcast_object_list([("stop", ())], src=0, group=self._ctrl)

    # ------------------------------------------------------------------ sharded work

    def _shard(self, items: Sequence[int], lengths: Sequence[int]) -> list[int]:
        """This rank's part of ``items``: longest first, dealt round-robin (token-balanced)."""
        order = sorted(items, key=lambda i: -lengths[i])
        return order[self.rank :: self.world]

    def _max_over_ranks(self, n: int) -> int:
        t = torch.tensor([n], dtype=torch.long)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._ctrl)
        return int(t.item())

    def _score(self, model: torch.nn.Module, samples: Sequence[Sample], stop: bool = False) -> list[Tensor]:
        """Each rank scores its share; results are exchanged so every rank holds all of them."""
        if self.world == 1:
            return super()._score(model, samples, stop)
        lengths = [s.num_tokens for s in samples]
        mine = self._shard(range(len(samples)), lengths)
        n_fwd = len(micro_batches([lengths[i] for i in mine], self.tc.micro_batch_tokens)) if mine else 0
        scored = super()._score(model, [samples[i] for i in mine], stop) if mine else []
        # FSDP's forward is a collective: match the busiest rank's number of forwards.
        for _ in range(self._max_over_ranks(n_fwd) - n_fwd):
            super()._score(model, samples[:1], stop)
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(
            gathered, [(i, t.tolist()) for i, t in zip(mine, scored, strict=True)], group=self._ctrl
        )
        out: list[Tensor] = [torch.empty(0)] * len(samples)
        for part in gathered:
            for i, row in part:
                out[i] = torch.tensor(row, dtype=torch.float32)
        return out

    def train_update(
        self, samples: list[Sample], interrupted: Callable[[], bool] | None = None
    ) -> dict[str, float]:
        """One PPO update, :meth:`Trainer.train_update`'s loop over all processes (same metrics).
        ``interrupted`` is not asked: every process must run the same steps, so an update started
        is finished."""
        with self._collective("train_update", samples):
            return super().train_update(samples)

    # -- the update loop's hooks (see Trainer.train_update) --

    def _my_rows(self, idx: list[int], lengths: Sequence[int]) -> list[int]:
        """This rank's share of the mini-batch, token-balanced."""
        return self._shard(idx, lengths)

    def _pad_micro_steps(self, n_micro: int) -> int:
        """FSDP's forward and backward are collectives: match the busiest rank's micro-step count."""
        return self._max_over_ranks(n_micro) - n_micro

    def _backward(self, loss: Tensor) -> None:
        # FSDP averages gradients over ranks; the world-size factor makes it their sum, so a step
        # equals the single-process step on the whole mini-batch (each rank divides by its tokens).
        (loss * self.world).backward()

    def _clip_grads(self) -> float:
        return self._sync_and_clip()

    def _all_ok(self, ok: bool) -> bool:
        """A step is applied only if every rank's loss and the global gradient norm were finite."""
        if self.world == 1:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.long)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._ctrl)
        return bool(flag.item())

    def _sum_over_processes(self, totals: Tensor) -> Tensor:
        if self.world > 1:
            dist.all_reduce(totals, group=self._ctrl)
        return totals

    def _sync_and_clip(self) -> float:
        """Average the replicated parameters' gradients, then clip all by the global norm.

        Sharded (DTensor) gradients were already reduced by FSDP. Same rule as
        ``clip_grad_norm_``: scale by ``max_norm / (norm + 1e-6)`` when that is below 1.
        """
        grads = [p.grad for p in self._replicated if p.grad is not None]
        if self.world > 1 and grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)  # sum of world-size-scaled gradients: divide back by the world size
            flat /= self.world
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        sq = torch.zeros((), dtype=torch.float64)
        for p in self.params:
            if p.grad is None:
                continue
            n = torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32)
            if hasattr(n, "full_tensor"):
                n = n.full_tensor()
            sq += float(n) ** 2
        norm = float(sq.sqrt())
        coef = self.tc.max_grad_norm / (norm + 1e-6)
        if coef < 1.0:
            for p in self.params:
                if p.grad is not None:
                    p.grad.detach().mul_(coef)
        return norm

    # ------------------------------------------------------------------ export / checkpoints

    def _full_state(self) -> dict[str, Tensor]:
        """The unsharded weights on rank 0 (CPU); an empty dict elsewhere. A collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # With full_state_dict every value is a plain (gathered) tensor, not a DTensor shard.
        return cast(
            dict[str, Tensor],
            get_model_state_dict(
                self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            ),
        )

    def _policy_weights(self) -> dict[str, Tensor]:
        """Gather the unsharded weights for an export (a collective: every rank calls it)."""
        return self._full_state()

    def export_policy(self, directory: Path, version: int) -> Path:
        """As :meth:`Trainer.export_policy`; every rank takes part, rank 0 writes."""
        with self._collective("export_policy", directory, version):
            if self.rank == 0:
                final = super().export_policy(directory, version)
            else:
                self._policy_weights()  # the gather rank 0's export is waiting for
                final = Path(directory) / f"v{version:06d}"
            self._barrier()
            return final

    def _barrier(self) -> None:
        if self.world > 1:
            dist.barrier(group=self._ctrl)

    def _from_rank0(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (a broadcast on the control group)."""
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self._ctrl)
        return box[0]

    def _dcp_state(self) -> dict[str, Any]:
        """Sharded model + optimizer state for DCP; with LoRA only the trainable (adapter) weights."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        if self.tc.lora:
            trainable = {name for name, p in self.model.named_parameters() if p.requires_grad}
            model_sd = {k: v for k, v in model_sd.items() if k in trainable}
        return {"model": model_sd, "optim": optim_sd}

    def _checkpoint_state(self) -> dict[str, Any]:
        """The base class's state plus who wrote it: resume refuses a non-FSDP checkpoint."""
        return {**super()._checkpoint_state(), "backend": "fsdp", "num_processes": self.world}

    def save_checkpoint(self) -> Path:
        """Sharded DCP state + the gathered policy export, published like the base class's checkpoints."""
        import torch.distributed.checkpoint as dcp

        with self._collective("save_checkpoint"):
            # One temporary directory for all ranks (the tag is not a process id), and rank 0's name
            # for it, so the ranks cannot disagree on where to write; receiving it also means rank 0
            # has created it.
            pub = Publication(self.checkpoint_root, checkpoint_name(self.step), tag="")
            if self.rank == 0:
                pub.begin()
            pub = self._from_rank0(pub)
            self._write_policy(pub.tmp / POLICY_SUBDIR, self.policy_version)
            dcp.save(self._dcp_state(), checkpoint_id=str(pub.tmp / DCP_SUBDIR))
            self._barrier()  # every shard is written before rank 0 publishes them
            if self.rank == 0:
                self._publish_checkpoint(pub)
                print(f"[train] checkpoint saved: {pub.final} ({self.world} shard(s))", flush=True)
            self._barrier()
            return pub.final

    def resume(self) -> bool:
        """Load the latest DCP checkpoint, whatever process count wrote it; False when there is none."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        with self._collective("resume"):
            ckpt = self.latest_checkpoint()
            if ckpt is None:
                return False
            state = json.loads((ckpt / STATE_FILE).read_text(encoding="utf-8"))
            if state.get("backend") != "fsdp" or not (ckpt / DCP_SUBDIR).is_dir():
                raise ValueError(
                    f'checkpoint {ckpt} was written by [training] backend = "torch"; an fsdp run '
                    "resumes only fsdp checkpoints (its policy/ export loads as weights)"
                )
            mismatch = config_mismatch(ckpt, self.tc)  # lora, its rank / alpha / targets
            if mismatch:
                raise ValueError(mismatch)
            sd = self._dcp_state()
            dcp.load(sd, checkpoint_id=str(ckpt / DCP_SUBDIR))
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=sd["model"],
                optim_state_dict=sd["optim"],
                options=StateDictOptions(strict=not self.tc.lora),
            )
            self.step = int(state["step"])
            self.policy_version = int(state["policy_version"])
            if self.rank == 0:
                print(
                    f"[train] resumed from {ckpt} (step={self.step}, written by "
                    f"{state.get('num_processes')} process(es), now {self.world})",
                    flush=True,
                )
            return True


# ---------------------------------------------------------------------- process launching


def init_process_group(rank: int, world: int, device: str, addr: str, port: int) -> None:
    """Join the group: nccl when training on CUDA, gloo on CPU."""
    os.environ.update(
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=os.environ.get("LOCAL_RANK", str(rank)),
    )
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)


def _spawned(rank: int, fn: Callable[..., Any], world: int, device: str, port: int, args: tuple) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if rank > 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 decides when to stop; followers obey it
    init_process_group(rank, world, device, "127.0.0.1", port)
    try:
        fn(rank, world, *args)
        if world > 1:
            # Rank 0 hosts the rendezvous store: if it tears its group down while a follower is still
            # finishing its last receive, the store's server thread is destroyed under it and the
            # process aborts at exit ("terminate called without an active exception").
            dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(
    fn: Callable[..., Any],
    nprocs: int,
    *args: Any,
    device: str = "cpu",
    on_start: Callable[[list[int]], None] | None = None,
) -> None:
    """Run ``fn(rank, world, *args)`` in ``nprocs`` fresh processes joined in one process group.

    ``fn`` must be importable (a module-level function). Raises if any process fails (the others are
    then terminated by torch.multiprocessing). ``on_start`` receives the process ids (rank order).
    """
    import torch.multiprocessing as mp

    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    ctx = mp.start_processes(
        _spawned,
        args=(fn, nprocs, device, free_port(), args),
        nprocs=nprocs,
        join=False,
        start_method="spawn",
    )
    if on_start is not None:
        on_start([p.pid for p in ctx.processes])
    while not ctx.join(timeout=1.0):
        pass


def _loop_rank(rank: int, world: int, config_path: str, policy_url: str | None, rc_file: str) -> None:
    """One process of an FSDP training run: rank 0 runs the loop, the others follow it."""
    cfg = load_config(config_path)
    trainer = FSDPTrainer(cfg, cfg.policy_service.model)
    if rank != 0:
        trainer.follow()
        return
    loop = TrainingLoop(cfg, policy_url, trainer=trainer)
    signal.signal(signal.SIGTERM, lambda *_: loop.stop())
    signal.signal(signal.SIGINT, lambda *_: loop.stop())
    rc = 1
    try:
        loop.start()
        rc = loop.run()
    finally:
        trainer.release_followers()
        Path(rc_file).write_text(str(rc), encoding="utf-8")


def run_training(config_path: str, policy_url: str | None, num_processes: int | None = None) -> int:
    """Run the FSDP training loop over ``num_processes`` (default ``[training] num_processes``).

    Under ``torchrun`` (``RANK`` set) this process is one rank; otherwise it spawns the ranks and
    forwards SIGTERM / SIGINT to rank 0, which finishes with a checkpoint and releases the others.
    Returns the loop's exit code. Spawned processes re-import the caller's main module: call this
    under ``if __name__ == "__main__":``.
    """
    import tempfile

    cfg = load_config(config_path)
    n = num_processes or cfg.training.num_processes
    with tempfile.TemporaryDirectory(prefix="openclaw_fsdp_") as tmp:
        rc_file = str(Path(tmp) / "rc")
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            backend = "nccl" if cfg.training.device.startswith("cuda") else "gloo"
            dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
            try:
                _loop_rank(rank, world, config_path, policy_url, rc_file)
                if world > 1:
                    dist.barrier()  # as in _spawned: the store's host leaves last
            finally:
                dist.destroy_process_group()
            return int(Path(rc_file).read_text()) if rank == 0 else 0
        pids: list[int] = []

        def forward(signum: int, _frame: object) -> None:
            if pids:
                os.kill(pids[0], signum)  # rank 0 stops the loop cleanly; the others follow it

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        spawn(
            _loop_rank, n, config_path, policy_url, rc_file, device=cfg.training.device, on_start=pids.extend
        )
        return int(Path(rc_file).read_text()) if Path(rc_file).is_file() else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openclaw_rl.trainer.fsdp")
    parser.add_argument("--config", required=True)
    parser.add_argument("--policy-url", default=None, help="policy service to swap weights into")
    parser.add_argument(
        "--num-processes",
        type=int,
        default=None,
        help="override [training] num_processes (ignored under torchrun)",
    )
    args = parser.parse_args(argv)
    return run_training(args.config, args.policy_url, args.num_processes)


if __name__ == "__main__":
    sys.exit(main())

"""Data-parallel learners (``cluster.learners = M``): the training process is rank 0, and ``M - 1`` Ray
actors are ranks 1..M-1, joined in one ``torch.distributed`` process group (gloo on CPU, NCCL when the
learners are on CUDA).

Plain actors that set up their own process group, not Ray Train's ``TorchTrainer``: the training
process keeps the loop, the sampler, the checkpoints and the metrics (one writer), and is itself a
learner; a ``TorchTrainer`` would move the whole loop into its workers and make the driver a bystander.

Each optimizer step's micro-batches are dealt round-robin (rank ``r`` takes micro-batches ``r, r + M,
...``). Every rank's loss uses the normalisers of the whole mini-batch (:func:`.losses.loss_normalizers`),
so the ranks' gradients add up to the one-process gradient; they are summed with ``all_reduce``, then
every rank clips and steps the same sum, and the replicas stay equal. The metric sums are summed the
same way. A learner that dies breaks the group: the step fails with an error naming it, and
``--resume`` continues from the last checkpoint (the driver's), exactly as a single process would.
"""

from __future__ import annotations

import copy
import datetime
import socket

import torch

from ..errors import SparserlError
from ..models.mixed_precision import learner_precision

TIMEOUT_S = 120  # a collective that waits longer than this fails the step (a learner stopped answering)


class LearnerError(SparserlError, RuntimeError):
    """A data-parallel learner died or its process group broke."""


class Ranks:
    """This process's place in the learners' group: which micro-batches it computes, and the sums."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def mine(self, index: int) -> bool:
        """Whether micro-batch ``index`` (within an optimizer step) is this rank's."""
        return index % self.world == self.rank

    def sum_grads(self, model: torch.nn.Module) -> None:
        """Every parameter's gradient summed over the ranks, in place (one flat buffer)."""
        import torch.distributed as dist

        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:  # this rank computed no micro-batch of the step
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def sum_floats(self, values: list[float]) -> list[float]:
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()


def _on(record, device):
    """A shallow copy of ``record`` (a batch, a correction) with its tensors on ``device``; ``record``
    itself is left where it is (the driver keeps using it)."""
    out = copy.copy(record)
    for name, value in vars(record).items():
        if isinstance(value, torch.Tensor):
            setattr(out, name, value.to(device))
    return out


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _init_group(init_method: str, rank: int, world: int, device: torch.device) -> None:
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S)
    )


def peer_config(cfg, device: torch.device):
    """The config the other learners build from: the driver's, with its learner's precision resolved
    here (``model.mixed_precision: auto`` measured on the driver's machine, not again on each node's,
    so that every learner computes its share of the gradient alike)."""
    peer = copy.deepcopy(cfg)
    peer.model.mixed_precision = learner_precision(cfg.model, device)
    return peer


class LearnerPeer:
    """A learner of rank >= 1, in a Ray actor: the run's learner, optimizer and schedule (built as the
    trainer builds them), in the group, updated with the driver's batch each step."""

    def __init__(self, cfg, rank: int, world: int):
        from .gradient_checkpointing import gradient_checkpointing_wanted, use_gradient_checkpointing
        from .learner import build_learner

        torch.manual_seed(cfg.train.seed)
        self.cfg = cfg
        _, self.learner, self.optimizer, self.scheduler = build_learner(cfg)
        use_gradient_checkpointing(self.learner, gradient_checkpointing_wanted(cfg, self.learner))
        self.ref = True if cfg.algorithm.kl_coef > 0 else None  # update_policy reads ref_logprobs from the batch
        self.engine = None  # no sampler here (QuRL's visibility metric is rank 0's)
        self.ranks = Ranks(rank, world)

    def pid(self) -> int:
        import os

        return os.getpid()

    def join(self, init_method: str) -> None:
        """Enter the learners' process group (returns once every rank has)."""
        _init_group(init_method, self.ranks.rank, self.ranks.world, next(self.learner.parameters()).device)

    def load(self, states: tuple) -> None:
        """The driver's learner, optimizer and schedule states (at the start, and after a resume)."""
        learner_state, optimizer_state, scheduler_state = states
        self.learner.load_state_dict(learner_state)
        self.optimizer.load_state_dict(optimizer_state)
        self.scheduler.load_state_dict(scheduler_state)

    def update(self, payload: tuple) -> None:
        """This rank's share of the step's update (``payload``: the driver's batch and corrections)."""
        from .update import update_policy

        device = next(self.learner.parameters()).device
        batch, corr = (_on(record, device) for record in payload)
        update_policy(self, batch, corr)

    def state(self) -> dict:
        return {k: v.detach().clone() for k, v in self.learner.state_dict().items()}


class LearnerGroup:
    """The driver's side: starts the peers, syncs their state, runs their share of each update."""

    def __init__(self, cfg, trainer):
        import ray

        from ..cluster.pool import connect, require_resources, resources_needed

        c = cfg.cluster
        self.world = c.learners
        self.started_ray = connect(c.address, resources_needed(c)["CPU"])
        require_resources(
            {"CPU": (self.world - 1) * c.learner_cpus, "GPU": (self.world - 1) * c.learner_gpus},
            f"{self.world - 1} learner actors",
        )
        host = ray.util.get_node_ip_address()
        init_method = f"tcp://{host}:{_free_port(host)}"
        actor = ray.remote(LearnerPeer).options(num_cpus=c.learner_cpus, num_gpus=c.learner_gpus, max_restarts=0)
        self.peers = [actor.remote(peer_config(cfg, trainer.device), rank, self.world) for rank in range(1, self.world)]
        self._wait([p.pid.remote() for p in self.peers], "starting")  # built (or failed) before the rendezvous
        joined = [p.join.remote(init_method) for p in self.peers]
        _init_group(init_method, 0, self.world, trainer.device)  # returns once every peer has joined
        self._wait(joined, "joining the process group")
        self.ranks = Ranks(0, self.world)
        self.sync(trainer)

    def sync(self, trainer) -> None:
        """The driver's learner, optimizer and schedule into every peer."""
        import ray

        states = ray.put((trainer.learner.state_dict(), trainer.optimizer.state_dict(), trainer.scheduler.state_dict()))
        self._wait([p.load.remote(states) for p in self.peers], "loading the driver's state")

    def start_update(self, batch, corr) -> list:
        """The peers start their share of this step's update (they meet the driver in its collectives)."""
        import ray

        refs = ray.put((_on(batch, "cpu"), _on(corr, "cpu")))
        return [p.update.remote(refs) for p in self.peers]

    def finish_update(self, refs: list) -> None:
        self._wait(refs, "updating")

    def _wait(self, refs: list, what: str) -> None:
        import ray
        from ray.exceptions import RayActorError

        for rank, ref in enumerate(refs, start=1):
            try:
                ray.get(ref)
            except RayActorError as e:
                cause = (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]
                raise LearnerError(
                    f"cluster: learner {rank} of {self.world} died ({what}): {cause}; the run stops "
                    "here: `sparserl train --resume` continues from the last checkpoint"
                ) from None

    def close(self) -> None:
        """Stop the peers, leave the process group, and stop Ray when this group started it."""
        import torch.distributed as dist

        from ..cluster.pool import stop_actors

        if dist.is_initialized():
            dist.destroy_process_group()
        stop_actors(self.peers, self.started_ray)
        self.peers = []

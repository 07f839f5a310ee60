"""Data parallelism on torch.distributed: shard a sweep's examples across ranks, combine on all.

Started by torchrun (`torchrun --nproc_per_node=N -m headscope report ...`): `init_from_env`
reads WORLD_SIZE/RANK/LOCAL_RANK and opens a process group, nccl when the model runs on CUDA
(one GPU per local rank), gloo on CPU. Each engine then runs its contiguous block of examples
(`shard`) and combines at its aggregation point: sums with `all_reduce_sum` (in float64, so
the order of addition costs no accuracy), per-example rows with `gather_objects` (rank order
equals example order), so every rank ends with the same global values and stays in lockstep.
Without a process group every function is a no-op: single-process code paths are unchanged.
"""
from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

T = TypeVar("T")
R = TypeVar("R")
TIMEOUT_ENV = "HEADSCOPE_DIST_TIMEOUT_S"  # seconds a rank waits in a collective before failing
_OWNED = {"group": False}  # whether init_from_env opened the group (then shutdown closes it)


def active() -> bool:
    """True inside an initialised process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """Rank 0 (or a single process): the one that writes files, logs and shows progress bars."""
    return rank() == 0


def init_from_env(device: str | torch.device | None = None) -> bool:
    """Open the process group torchrun describes (WORLD_SIZE > 1); idempotent. Returns active().

    Backend: nccl when `device` is CUDA (or None and CUDA is available), else gloo. With nccl
    each process first selects GPU LOCAL_RANK, so `load_model(device="cuda")` lands on its own
    GPU. HEADSCOPE_DIST_TIMEOUT_S bounds how long a rank waits for the others (torch's default
    otherwise), so an error on one rank fails the others instead of hanging them.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not dist.is_available() or dist.is_initialized():
        return active()
    kind = torch.device(device).type if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    backend = "nccl" if kind == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = os.environ.get(TIMEOUT_ENV)
    kwargs = {"timeout": datetime.timedelta(seconds=float(timeout))} if timeout else {}
    dist.init_process_group(backend=backend, **kwargs)
    _OWNED["group"] = True
    return active()


def shutdown() -> None:
    """Wait for every rank, then close the process group if init_from_env opened it."""
    if _OWNED["group"] and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        _OWNED["group"] = False


def block(n: int, rank_: int, size: int) -> range:
    """Rank rank_'s contiguous block of range(n) split over `size` ranks; blocks differ in length
    by at most one, come in rank order and cover each index once."""
    base, extra = divmod(n, size)
    start = rank_ * base + min(rank_, extra)
    return range(start, start + base + (rank_ < extra))


def shard(n: int) -> range:
    """This rank's block of range(n) (all of it in a single process)."""
    return block(n, rank(), world_size())


def _comm_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of `tensor` over ranks (a new tensor, same dtype and device), reduced in float64.

    Single-process: the tensor itself.
    """
    if not active():
        return tensor
    buf = tensor.detach().to(_comm_device(), torch.float64)
    dist.all_reduce(buf)
    return buf.to(tensor.device, tensor.dtype)


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj` (picklable; tensors travel on CPU), in rank order, on every rank."""
    if not active():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, _to_cpu(obj))
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (e.g. an output folder or an error to raise everywhere)."""
    if not active():
        return obj
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if active():
        dist.barrier()


def map_sharded(fn: Callable[[T], R], items: Sequence[T], *, progress: bool = False, desc: str | None = None) -> list[R]:
    """[fn(x) for x in items], each rank computing its contiguous block; the full list on every rank."""
    mine = [fn(x) for x in tqdm([items[i] for i in shard(len(items))], desc=desc, disable=not (progress and is_main()))]
    return [y for part in gather_objects(mine) for y in part]

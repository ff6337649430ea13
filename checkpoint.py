"""Checkpoints that survive a crash: atomic, verified on load, resumable to the same step.

A checkpoint is out_dir/<run>/ckpt-<step>/ holding
  model.safetensors, config.json, tokenizer files   Hugging Face format: loads in transformers and `vllm serve`
  optimizer.pt                                       full AdamW state (torch.load(weights_only=True))
  state.json                                         counters, data order and curriculum (NPR), drawn prompts
  rng.pt                                             every rank's torch RNG states
  manifest.json                                      the size of every file above, written last
It is written to ckpt-<step>.tmp and renamed into place, so a folder named ckpt-<step> is complete; on load a
file whose size differs from the manifest (a truncated copy, a half-synced disk) makes us fall back to the
previous checkpoint. Only safetensors and weights_only torch.load are used: no pickle code runs on load.
"""
import glob
import json
import os
import shutil

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)


def model_dir(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, f"ckpt-{step:06d}")


def save(run_dir: str, state: dict, model, optimizer, sampler_state: dict, tokenizer, run_name: str, keep: int):
    """Collective: every rank calls it. Rank 0 writes. Nothing in it depends on the number of ranks, so a run
    may resume on a different number of devices."""
    rank, world = dist.get_rank(), dist.get_world_size()
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=full)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=full)
    rngs = [None] * world
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    dist.all_gather_object(rngs, rng)
    if rank == 0:
        final = model_dir(run_dir, state["step"])
        tmp = final + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        model.save_pretrained(tmp, state_dict=model_sd)
        tokenizer.save_pretrained(tmp)
        torch.save(optim_sd, os.path.join(tmp, "optimizer.pt"))
        torch.save(rngs, os.path.join(tmp, "rng.pt"))
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump({"counters": state, "world_size": world, "sampler": sampler_state, "run_name": run_name}, f)
        sizes = {name: os.path.getsize(os.path.join(tmp, name)) for name in sorted(os.listdir(tmp))}
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(sizes, f)
        for name in os.listdir(tmp):  # on disk before the rename makes it visible
            with open(os.path.join(tmp, name), "rb") as fh:
                os.fsync(fh.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        dir_fd = os.open(run_dir, os.O_RDONLY)  # the rename itself on disk too
        os.fsync(dir_fd)
        os.close(dir_fd)
        for old in sorted(glob.glob(os.path.join(run_dir, "ckpt-[0-9]*[0-9]")))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def _verify(path: str) -> str | None:
    """None if the checkpoint looks complete, else why not."""
    try:
        with open(os.path.join(path, "manifest.json")) as f:
            sizes = json.load(f)
        for name, size in sizes.items():
            actual = os.path.getsize(os.path.join(path, name))
            if actual != size:
                return f"{name} has {actual} bytes, expected {size}"
        with open(os.path.join(path, "state.json")) as f:
            json.load(f)
        from safetensors import safe_open
        for name in sizes:
            if name.endswith(".safetensors"):
                with safe_open(os.path.join(path, name), "pt") as f:
                    f.keys()
    except Exception as e:  # any unreadable piece means: not this one
        return f"{type(e).__name__}: {e}"
    return None


def find_latest(run_dir: str, log=print) -> str | None:
    """The newest complete checkpoint folder (rank 0 decides, every rank gets the answer)."""
    choice = [None]
    if dist.get_rank() == 0:
        for path in sorted(glob.glob(os.path.join(run_dir, "ckpt-[0-9]*[0-9]")), reverse=True):
            why = _verify(path)
            if why is None:
                choice[0] = path
                break
            log(f"warning: skipping checkpoint {path}: {why}; trying the previous one")
    dist.broadcast_object_list(choice)
    return choice[0]


def load_state(path: str, model, optimizer, sampler, rank: int) -> dict:
    """Restore optimizer, data order, curriculum and RNG; return the counters. The model weights were loaded
    from the same folder by from_pretrained."""
    with open(os.path.join(path, "state.json")) as f:
        saved = json.load(f)
    optim_sd, status = {}, [None]
    if rank == 0:  # the only reader; every rank must learn whether it worked, or the others would wait forever
        try:
            optim_sd = torch.load(os.path.join(path, "optimizer.pt"), weights_only=True)
        except Exception as e:
            status = [f"{type(e).__name__}: {e}"]
    dist.broadcast_object_list(status)
    if status[0] is not None:
        raise RuntimeError(f"{path}/optimizer.pt cannot be read ({status[0][:200]})")
    set_optimizer_state_dict(model, optimizer, optim_sd,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    sampler.load_state_dict(saved["sampler"])
    rngs = torch.load(os.path.join(path, "rng.pt"), weights_only=True)
    if rank < len(rngs):  # the same number of ranks as before: each gets its own RNG state back
        torch.set_rng_state(rngs[rank]["cpu"])
        if "cuda" in rngs[rank] and torch.cuda.is_available():
            torch.cuda.set_rng_state(rngs[rank]["cuda"])
    return saved["counters"]

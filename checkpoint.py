"""Checkpoints that cannot lie, and one writer per run: atomic, verified by content, resumable to the same step.

A checkpoint is out_dir/<run>/ckpt-<step>/ holding
  model.safetensors, config.json, tokenizer files   Hugging Face format: loads in transformers and `vllm serve`
  optimizer.pt                                       full AdamW state (torch.load(weights_only=True))
  state.json                                         counters, data order and curriculum (NPR), drawn prompts
  rng.pt                                             every rank's torch RNG states
  manifest.json                                      the size and SHA-256 of every file above, written last
It is written to ckpt-<step>.tmp and renamed into place, so a folder named ckpt-<step> is complete. On load every
file is checked against the manifest by content (a flipped byte fails, whatever the size), state.json must hold
what a resume reads, rng.pt must load, and every weight must be finite; any failure falls back to the previous
checkpoint with a warning. Rotation deletes old checkpoints only once the new one has verified, so the newest
checkpoint that verified is never deleted. Only safetensors and weights_only torch.load are used: no pickle
code runs on load.

claim_run(...) makes a process the run's only writer (out_dir/<run>/lock, an fcntl lock that the kernel
releases when the process dies, so a killed run's lock never blocks its resume) and refuses a new run on a used
name.
"""
import fcntl
import glob
import hashlib
import json
import os
import shutil
import socket
import stat
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)

REQUIRED = ("config.json", "optimizer.pt", "rng.pt", "state.json")  # plus at least one *.safetensors
MAX_MANIFEST_BYTES = 1 << 20


def model_dir(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, f"ckpt-{step:06d}")


def write_token(path: str) -> str:
    """A random token written to path and synced: other ranks read it back to prove they share the folder."""
    token = os.urandom(8).hex()
    with open(path, "w") as f:
        f.write(token)
        f.flush()
        os.fsync(f.fileno())
    return token


def all_checkpoints(run_dir: str) -> list[str]:
    """Complete (renamed) checkpoint folders, oldest first. Only real folders: a link or a file named like one (a
    symlink loop) is neither resumed nor rotated nor counted as the newest."""
    return sorted(p for p in glob.glob(os.path.join(run_dir, "ckpt-[0-9]*[0-9]"))
                  if os.path.isdir(p) and not os.path.islink(p))


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def save(run_dir: str, state: dict, model, optimizer, sampler_state: dict, tokenizer, run_name: str, keep: int,
         log=print, run_config: dict | None = None):
    """Collective: every rank calls it. Rank 0 writes. Nothing in it depends on the number of ranks, so a run
    may resume on a different number of devices. run_config (the flags) is saved with it: a resume checks its
    training settings against the checkpoint, whatever happened to the log."""
    rank, world = dist.get_rank(), dist.get_world_size()
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=full)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=full)
    rngs = [None] * world
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    dist.all_gather_object(rngs, rng)
    status = [None]
    if rank == 0:
        try:
            _write(run_dir, state, model, model_sd, optim_sd, rngs, world, sampler_state, tokenizer,
                   {"run_name": run_name, "config": run_config}, keep, log)
        except Exception as e:  # a full disk, a quota, a vanished mount (torch and safetensors raise their own
            #                     types for a failed write): the previous checkpoints stay as they were
            why = getattr(e, "strerror", None) or (str(e).splitlines() or [""])[0][:200]
            try:  # torch says "unexpected pos" or "file write failed" where the OS said "no space left"
                free = shutil.disk_usage(run_dir).free
                why = f"no space left on the device: {free >> 20} MiB free; {why}" if free < 256 << 20 else why
            except OSError:
                pass
            shutil.rmtree(model_dir(run_dir, state["step"]) + ".tmp", ignore_errors=True)
            status = [f"the checkpoint of step {state['step']} could not be written ({type(e).__name__}: {why}); its "
                      f"temporary folder is removed and the previous checkpoints in {run_dir} are intact"]
    dist.broadcast_object_list(status)
    if status[0]:
        raise RuntimeError(status[0])


def _write(run_dir, state, model, model_sd, optim_sd, rngs, world, sampler_state, tokenizer, run, keep, log):
    """Rank 0's part of save: a temporary folder, synced, hashed, renamed into place; then rotation."""
    final = model_dir(run_dir, state["step"])
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    model.save_pretrained(tmp, state_dict=model_sd)
    tokenizer.save_pretrained(tmp)
    torch.save(optim_sd, os.path.join(tmp, "optimizer.pt"))
    torch.save(rngs, os.path.join(tmp, "rng.pt"))
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump({"counters": state, "world_size": world, "sampler": sampler_state, **run}, f)
    files = sorted(os.path.relpath(os.path.join(d, n), tmp) for d, _, names in os.walk(tmp) for n in names)
    for name in files:  # on disk before the manifest vouches for them
        with open(os.path.join(tmp, name), "rb") as fh:
            os.fsync(fh.fileno())
    manifest = {name: {"bytes": os.path.getsize(os.path.join(tmp, name)),
                       "sha256": file_sha256(os.path.join(tmp, name))} for name in files}
    with open(os.path.join(tmp, "manifest.json"), "w") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    dir_fd = os.open(run_dir, os.O_RDONLY)  # the rename itself on disk too
    os.fsync(dir_fd)
    os.close(dir_fd)
    # only a checkpoint that would verify may retire older ones: its hashes were read back from the synced
    # files above, so what is left to check is that its weights are finite (in memory: no second read)
    bad = next((k for k, t in model_sd.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())), None)
    if bad is None:
        for old in all_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    else:
        log(f"warning: the checkpoint just written has non-finite weights ({bad}); older checkpoints are kept")


def _regular(path: str) -> bool:
    """A plain file (a FIFO or a device named like a checkpoint file would hang or lie when read)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def verify(path: str, log=print) -> str | None:
    """None if the checkpoint is complete and intact, else why not."""
    try:
        manifest_path = os.path.join(path, "manifest.json")
        if not _regular(manifest_path):
            return "manifest.json is missing or not a regular file"
        if os.path.getsize(manifest_path) > MAX_MANIFEST_BYTES:
            return "manifest.json is implausibly large"
        with open(manifest_path) as f:
            manifest = json.load(f)
        if not isinstance(manifest, dict) or not manifest:
            return "manifest.json is not a checkpoint manifest"
        if all(isinstance(v, int) for v in manifest.values()):  # written before SHA-256s: sizes only
            log(f"warning: {path} predates content hashes; checking file sizes only")
            manifest = {name: {"bytes": size} for name, size in manifest.items()}
        elif not all(isinstance(v, dict) for v in manifest.values()):
            return "manifest.json is not a checkpoint manifest"
        missing = [n for n in REQUIRED if n not in manifest]
        if missing or not any(n.endswith(".safetensors") for n in manifest):
            return f"manifest.json lists no {', '.join(missing) or '*.safetensors'}"
        for name, expect in manifest.items():
            full = os.path.normpath(os.path.join(path, name))
            if not full.startswith(os.path.normpath(path) + os.sep) or not _regular(full):
                return f"{name} is missing or not a regular file"
            if os.path.getsize(full) != expect.get("bytes"):
                return f"{name} has {os.path.getsize(full)} bytes, expected {expect.get('bytes')}"
            if "sha256" in expect and file_sha256(full) != expect["sha256"]:
                return f"{name} does not match its SHA-256 in the manifest (corrupted)"
        with open(os.path.join(path, "state.json")) as f:
            saved = json.load(f)
        if not (isinstance(saved, dict) and isinstance(saved.get("counters"), dict)
                and isinstance(saved["counters"].get("step"), int) and isinstance(saved.get("sampler"), dict)):
            return "state.json lacks the counters or the sampler state"
        rngs = torch.load(os.path.join(path, "rng.pt"), weights_only=True)
        if not isinstance(rngs, list) or not all(isinstance(r, dict) and "cpu" in r for r in rngs):
            return "rng.pt holds no RNG states"
        from safetensors import safe_open
        for name in (n for n in manifest if n.endswith(".safetensors")):
            with safe_open(os.path.join(path, name), "pt") as f:
                for key in f.keys():
                    t = f.get_tensor(key)
                    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                        return f"{name}: weight {key} is not finite"
    except Exception as e:  # any unreadable piece means: not this one
        return f"{type(e).__name__}: {str(e)[:200]}"
    return None


def newest_verified(run_dir: str, log=print) -> str | None:
    """The newest checkpoint of a run that verifies, saying why each newer one is skipped; None if none does."""
    found = all_checkpoints(run_dir)
    for odd in sorted(set(glob.glob(os.path.join(run_dir, "ckpt-[0-9]*[0-9]"))) - set(found)):
        log(f"warning: skipping {odd}: not a checkpoint folder (a link or a file), never resumed nor rotated")
    for path in reversed(found):
        why = verify(path, log)
        if why is None:
            return path
        log(f"warning: skipping checkpoint {path}: {why}; trying the previous one")
    return None


def find_latest(run_dir: str, log=print) -> str | None:
    """newest_verified, decided on rank 0; every rank gets the answer."""
    choice = [newest_verified(run_dir, log) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(choice)
    return choice[0]


def load_state(path: str, model, optimizer, sampler, rank: int) -> dict:
    """Restore optimizer, data order, curriculum and RNG; return the counters. The model weights were loaded
    from the same folder by from_pretrained. A failure is a RuntimeError with one line (the files verified, so
    this means a file this code cannot use, e.g. from another version)."""
    with open(os.path.join(path, "state.json")) as f:
        saved = json.load(f)
    optim_sd, rngs, status = {}, [], [None]
    if rank == 0:  # the only reader; every rank must learn whether it worked, or the others would wait forever
        try:
            optim_sd = torch.load(os.path.join(path, "optimizer.pt"), weights_only=True)
        except Exception as e:
            status = [f"optimizer.pt: {type(e).__name__}: {str(e)[:200]}"]
    dist.broadcast_object_list(status)
    try:
        if status[0] is not None:
            raise RuntimeError(status[0])
        set_optimizer_state_dict(model, optimizer, optim_sd,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        sampler.load_state_dict(saved["sampler"])
        rngs = torch.load(os.path.join(path, "rng.pt"), weights_only=True)
        if rank < len(rngs):  # the same number of ranks as before: each gets its own RNG state back
            torch.set_rng_state(rngs[rank]["cpu"])
            if "cuda" in rngs[rank] and torch.cuda.is_available():
                torch.cuda.set_rng_state(rngs[rank]["cuda"])
    except Exception as e:
        raise RuntimeError(f"{path} cannot be resumed from ({type(e).__name__}: {str(e)[:200]})") from None
    return check_counters(saved.get("counters"), path)


COUNTERS = ("step", "version", "samples", "tokens", "bad_steps")  # non-negative integers; gpu_hours a number


def check_counters(counters, path: str) -> dict:
    """The saved counters, if they can be true of this checkpoint: non-negative, the step the one its folder is
    named by, the policy version at most the step. Else a RuntimeError with one line (a hand-edited or
    foreign state.json: resuming from it would give a negative learning rate or folders never rotated)."""
    def bad(why):
        raise RuntimeError(f"{path}: state.json's counters are not those of this checkpoint ({why})")
    if not isinstance(counters, dict):
        bad("no counters")
    for name in COUNTERS:
        value = counters.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**53:
            bad(f"{name} = {value!r}")
    hours = counters.get("gpu_hours")
    if not isinstance(hours, (int, float)) or isinstance(hours, bool) or not 0 <= hours < float("inf"):
        bad(f"gpu_hours = {hours!r}")
    if os.path.basename(os.path.normpath(path)) != os.path.basename(model_dir("", counters["step"])):
        bad(f"step {counters['step']} in a folder named {os.path.basename(os.path.normpath(path))}")
    if counters["version"] > counters["step"]:
        bad(f"version {counters['version']} after {counters['step']} steps")
    return counters


# what a resumed run may change: how long it runs, what it records and how it lays out memory and devices (none
# changes the gradient: micro-batching, --tp and --generators are tested not to); every other flag must stay as it was
SAFE_ON_RESUME = {"resume", "dry_run", "max_steps", "save_every", "keep_checkpoints", "dump_every", "wandb",
                  "log_dir", "out_dir", "max_bad_steps", "micro_batch_tokens", "logprob_chunk_tokens",
                  "activation_checkpointing", "tp", "generators", "peer_timeout_s", "vllm_memory", "vllm_kv_cache_gib"}


def log_config(log_path: str) -> dict | None:
    """The first config record of a log, or None (no log, or none in it)."""
    try:
        with open(log_path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:  # a line cut by a crash
                    continue
                if isinstance(record, dict) and record.get("kind") == "config":
                    return record
    except OSError:
        pass
    return None


def resume_changes(run_dir: str, log_path: str, now: dict) -> dict:
    """The flags a resume changes against the run's saved settings: {name: [was, now]} for those in
    SAFE_ON_RESUME; any other change raises RunError naming it (the run would silently mix two recipes). The settings
    come from the newest checkpoint that has them, so a moved or deleted log changes nothing; from the log's config
    record for checkpoints written before they were saved; with neither, no check: {}."""
    was = None
    for path in reversed(all_checkpoints(run_dir)):
        try:
            with open(os.path.join(path, "state.json")) as f:
                was = json.load(f).get("config")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(was, dict):
            break
    if not isinstance(was, dict):
        was = log_config(log_path) or {}
    changed = {k: [was[k], v] for k, v in now.items() if k in was and was[k] != v}
    refused = [k for k in changed if k not in SAFE_ON_RESUME]
    if refused:
        flags = ", ".join(f"--{k} was {changed[k][0]!r} and is {changed[k][1]!r}" for k in refused)
        may = ", ".join(sorted(SAFE_ON_RESUME - {"resume", "dry_run"}))
        raise RunError(f"--resume: {flags} now; a resumed run keeps its training settings (it may change {may})")
    return changed


class RunError(ValueError):
    """A run that must not start: one line for the user."""


_held_locks = []  # the run locks this process holds, open for its whole life
_new_run_dirs = []  # the run folders this process created


def drop_unstarted_runs():
    """Remove the run folders this process created that hold nothing but their lock: a run refused at start-up
    (a bad flag found after claim_run) leaves no empty folder behind."""
    for run_dir in _new_run_dirs:
        if os.listdir(run_dir) == ["lock"]:
            os.remove(os.path.join(run_dir, "lock"))
            os.rmdir(run_dir)


def claim_run(run_dir: str, log_path: str, resume: bool):
    """Before anything heavy starts: the log and run folders are writable, a new run does not reuse a name
    (it would append to the old log and overwrite its checkpoints), a resumed run exists, and this process is
    the run's only writer (the lock stays held until the process ends). Raises RunError.

    The lock is out_dir/<run>/lock with the holder's pid and host, held by fcntl.flock: the kernel drops it
    when its process dies, so a stale lock left by a killed run is simply taken over."""
    import tempfile
    folders = ((os.path.dirname(log_path) or ".", "--log_dir"), (os.path.dirname(run_dir) or ".", "--out_dir"))
    for folder, flag in folders:
        try:
            os.makedirs(folder, exist_ok=True)
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as e:
            reason = f"{type(e).__name__}: {e.strerror or e}"
            raise RunError(f"{flag} {folder} is not a writable folder ({reason})") from None
    if resume and not os.path.isdir(run_dir):
        raise RunError(f"--resume: no run folder {run_dir}")
    if not os.path.isdir(run_dir):
        _new_run_dirs.append(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    f = open(os.path.join(run_dir, "lock"), "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise RunError(f"run folder {run_dir} is in use by {holder}: one writer per run") from None
    except OSError as e:  # a file system without flock (some NFS, Lustre without -o flock): run, unguarded
        print(f"warning: cannot lock {run_dir} ({e.strerror or e}); make sure no other process writes this run",
              file=sys.stderr)
    if not resume and (all_checkpoints(run_dir) or (os.path.exists(log_path) and os.path.getsize(log_path))):
        f.close()
        raise RunError(f"a run named {os.path.basename(run_dir)} exists ({log_path}, {run_dir}): pass --resume to "
                       "continue it, or choose another --run_name")
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    _held_locks.append(f)

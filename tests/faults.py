"""Fault injection for the tests, kept out of train.py: patches the functions train.py calls, then runs train.py
as `python train.py` would. Used by conftest.run_train when a test passes SCALERL_FAULT_* variables:

    SCALERL_FAULT_NAN_STEPS=2,3    the gradient and loss of these steps are NaN
    SCALERL_FAULT_GRAD_FILE=path   save the first step's global loss and full gradient there (rank 0)
    SCALERL_FAULT_ENGINE_STEP=3    vLLM's engine raises during the generation of this step
    SCALERL_FAULT_SYNC=1:2         on rank 1, the weight sync of step 2 fails after loading two tensors
    SCALERL_FAULT_NODES=2          the ranks pretend to be on 2 machines (LOCAL_WORLD_SIZE, LOCAL_RANK): HSDP
    SCALERL_FAULT_DISK_FULL=2      the disk is full while the second checkpoint is written (its optimizer.pt)
    SCALERL_FAULT_UNSHARED=1       rank 1 sees another --out_dir than rank 0's (as on a machine without shared storage)
    SCALERL_FAULT_SOLVED=3         from step 3 on, every graded prompt counts as solved: NPR retires the whole training
                                   set within an epoch
    SCALERL_FAULT_FORK_SCHEDULE=1  a fork's schedule, --mode hoard: it generates two steps' worth at once and holds
                                   the second in Schedule.held (nothing else tells a checkpoint about those prompts)

    SCALERL_FAULT_KILL=gen:5       with --generators: the generator SIGKILLs itself at the 5th training group it is
                                   given (gen:N), or the trainer leader at its Nth optimizer step (leader:N)
    SCALERL_FAULT_NO_PUSH=2        with --generators: the leader announces its 2nd weight push and never sends it

Steps are counted from 1 in this process (after a --resume, the first step it runs is 1).

    python tests/faults.py <train.py flags>          (or under torchrun)
"""
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import checkpoint  # noqa: E402
import devices  # noqa: E402
import generate  # noqa: E402
import policy  # noqa: E402
import rollouts  # noqa: E402

nan_steps = {int(x) for x in os.environ.get("SCALERL_FAULT_NAN_STEPS", "").split(",") if x.strip()}
grad_file = os.environ.get("SCALERL_FAULT_GRAD_FILE")
engine_step = int(os.environ.get("SCALERL_FAULT_ENGINE_STEP", "0"))
calls = {"backward": 0, "optimizer_step": 0, "next_batch": 0}

backward, optimizer_step, next_batch = policy.backward, policy.optimizer_step, rollouts.Rollouts.next_batch


def nan_backward(model, *args, **kwargs):
    """A planted non-finite gradient: every gradient and the loss become NaN on the chosen steps."""
    calls["backward"] += 1
    sums = backward(model, *args, **kwargs)
    if calls["backward"] in nan_steps:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(float("nan"))
        sums["loss"] = float("nan")
    return sums


def saving_optimizer_step(model, optimizer, lr, grad_clip, loss, **kwargs):
    """The first step's global loss and full gradient, to compare runs on different numbers of ranks or
    micro-batches."""
    import torch
    import torch.distributed as dist
    calls["optimizer_step"] += 1
    if calls["optimizer_step"] == 1:
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
        if dist.get_rank() == 0:
            torch.save({"loss": loss, "grads": grads}, grad_file)
    return optimizer_step(model, optimizer, lr, grad_clip, loss, **kwargs)


def failing_next_batch(self):
    calls["next_batch"] += 1
    if calls["next_batch"] == engine_step:
        def fail():
            raise RuntimeError("injected engine failure (test)")
        self.gen.engine.step = fail
    return next_batch(self)


sync_rank, _, sync_step = os.environ.get("SCALERL_FAULT_SYNC", "").partition(":")
update_weights = generate.Generator.update_weights


def failing_update_weights(self, named_tensors, new_version=True):
    """The engine takes two tensors, then raises, on one rank at one step (as a reload of a new architecture might)."""
    calls["update_weights"] = calls.get("update_weights", 0) + 1
    if calls["update_weights"] == int(sync_step) and os.environ.get("RANK", "0") == sync_rank:
        def reload(method, kwargs):
            for _ in range(2):
                next(kwargs["weights_iterator"])
            raise RuntimeError("injected weight-sync failure (test)")
        self.llm.collective_rpc = reload
    return update_weights(self, named_tensors, new_version)


if os.environ.get("SCALERL_FAULT_NODES"):  # e.g. 2 ranks on "2 nodes" of 1: LOCAL_WORLD_SIZE 1, LOCAL_RANK 0
    local = int(os.environ["WORLD_SIZE"]) // int(os.environ["SCALERL_FAULT_NODES"])
    os.environ["LOCAL_WORLD_SIZE"], os.environ["LOCAL_RANK"] = str(local), str(int(os.environ["RANK"]) % local)
disk_full = int(os.environ.get("SCALERL_FAULT_DISK_FULL", "0"))
torch_save = checkpoint.torch.save


def full_disk_save(obj, path, *args, **kwargs):
    """torch.save as it fails on a full disk (the error type torch raises there), on the chosen checkpoint."""
    if str(path).endswith("optimizer.pt"):
        calls["checkpoint"] = calls.get("checkpoint", 0) + 1
        if calls["checkpoint"] == disk_full:
            with open(path, "wb") as f:  # a partial file, as a full disk leaves
                f.write(b"\0" * 100)
            usage = checkpoint.shutil.disk_usage  # and the file system says it has no room left
            checkpoint.shutil.disk_usage = lambda p: usage(p)._replace(free=0)
            raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                               "data/0: file write failed")
    return torch_save(obj, path, *args, **kwargs)




class Hoard(rollouts.Schedule):
    def next_batch(self, r):
        if not self.held:
            r.submit(r.cfg.prompts_per_step * 2)
            self.held = r.generate_all()
        per_rank = r.cfg.prompts_per_step // r.layout.world
        batch, self.held = self.held[:per_rank], self.held[per_rank:]
        return batch


solved_step = int(os.environ.get("SCALERL_FAULT_SOLVED", "0"))
record = rollouts.PromptSampler.record


def solving_record(self, prompt_idx, pass_rate):
    record(self, prompt_idx, 1.0 if calls["next_batch"] >= solved_step else pass_rate)


def counting_next_batch(self):
    calls["next_batch"] += 1
    return next_batch(self)


if solved_step:
    rollouts.PromptSampler.record = solving_record
    rollouts.Rollouts.next_batch = counting_next_batch
if os.environ.get("SCALERL_FAULT_FORK_SCHEDULE"):
    rollouts.SCHEDULES["hoard"] = Hoard
if sync_step:
    generate.Generator.update_weights = failing_update_weights
if disk_full:
    checkpoint.torch.save = full_disk_save
if os.environ.get("SCALERL_FAULT_UNSHARED") and os.environ.get("RANK") == "1":
    check_shared_dir = devices.check_shared_dir
    devices.check_shared_dir = lambda path, *args: check_shared_dir(path + ".elsewhere", *args)
if nan_steps:
    policy.backward = nan_backward
if grad_file:
    policy.optimizer_step = saving_optimizer_step
if engine_step:
    rollouts.Rollouts.next_batch = failing_next_batch
kill_role, _, kill_at = os.environ.get("SCALERL_FAULT_KILL", "").partition(":")
no_push = int(os.environ.get("SCALERL_FAULT_NO_PUSH", "0"))


def killing(function, role):
    """function, except that its kill_at-th call on a rank of this role SIGKILLs the process (no goodbye)."""
    def wrapped(*args, **kwargs):
        generator = os.environ.get("SCALERL_ROLE") == "generator"  # (a generator's RANK is its rank among them)
        training = len(args) > 6 and args[6] >= 0  # Generator.submit's serial: not an evaluation group
        mine = generator and training if role == "gen" else not generator and os.environ.get("RANK") == "0"
        calls[role] = calls.get(role, 0) + mine
        if mine and calls[role] == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)
        return function(*args, **kwargs)
    return wrapped


def silent_broadcast(self, flat):
    """The leader's no_push-th push: announced to the generators, then nothing sent."""
    calls["push"] = calls.get("push", 0) + (os.environ.get("SCALERL_ROLE") != "generator")
    if calls["push"] != no_push or os.environ.get("SCALERL_ROLE") == "generator":
        broadcast(self, flat)


import signal  # noqa: E402
import stream  # noqa: E402

broadcast = stream.Bridge.broadcast
if kill_role == "gen":
    generate.Generator.submit = killing(generate.Generator.submit, "gen")
if kill_role == "leader":
    policy.optimizer_step = killing(policy.optimizer_step, "leader")
if no_push:
    stream.Bridge.broadcast = silent_broadcast
sys.argv = [os.path.join(ROOT, "train.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")

"""The GPU path, decided by pure functions and tested here without a GPU: where each rank's engine runs, vLLM's
arguments for cuda and cpu x 1 and 8 ranks x each schedule, the memory plan, the chunked LM head with activation
checkpointing, and the prefix cache salted by weight version. The multi-rank runs (tensor parallelism, HSDP, a
failing weight sync) are in test_resilience.py.

    python -m pytest tests/test_gpu_path.py -q
"""

import pytest
import torch

import config
import devices
import generate
import policy
import rollouts

GIB = 2**30


@pytest.mark.parametrize("env,tp,want", [
    ({}, 1, dict(rank=0, world=1, engines=1, engine=0, tp_rank=0, mesh=(1,))),
    ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8"}, 1,
     dict(rank=5, world=8, engines=8, engine=5, tp_rank=0, mesh=(8,))),
    ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8"}, 2,
     dict(rank=5, world=8, engines=4, engine=2, tp_rank=1, mesh=(8,))),
    ({"RANK": "13", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8"}, 4,
     dict(rank=13, world=16, engines=4, engine=3, tp_rank=1, mesh=(2, 8))),
])
def test_layout_places_each_rank_on_its_own_device_and_engine(env, tp, want):
    layout = devices.layout_from_env(tp, env)
    got = dict(rank=layout.rank, world=layout.world, engines=layout.engines, engine=layout.engine,
               tp_rank=layout.tp_rank, mesh=layout.mesh_shape())
    assert got == want
    assert layout.device(cuda=True) == f"cuda:{env.get('LOCAL_RANK', 0)}" and layout.device(cuda=False) == "cpu"


@pytest.mark.parametrize("env,tp", [({}, 2), ({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}, 3),
                                    ({"RANK": "0", "WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "8"}, 1)])
def test_a_layout_that_cannot_be_built_is_one_line(env, tp):
    with pytest.raises(ValueError, match="--tp") as e:
        devices.layout_from_env(tp, env)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("world,tp", [(1, 1), (8, 1), (8, 2)])
@pytest.mark.parametrize("mode", list(rollouts.SCHEDULES))
def test_engine_args_for_each_device_world_and_schedule(device, world, tp, mode):
    cfg = config.parse_args(["--model", "some/model", "--mode", mode, "--batch", "768"])
    layout = devices.Layout(rank=world - 1, world=world, local_rank=world - 1, local_world=world, tp=tp)
    in_flight = rollouts.SCHEDULES[mode].updates_in_flight
    seqs = rollouts.seqs_in_flight(cfg, layout.engines)
    args = generate.engine_args(cfg, "m", device, layout, 16402, in_flight, gpu_memory=0.61, seqs_in_flight=seqs)
    cuda = device == "cuda"
    # placement: torchrun's ranks each run the external launcher (cuda:LOCAL_RANK, a compile cache per rank);
    # vLLM's default uniprocess executor would put all eight on cuda:0
    assert args["distributed_executor_backend"] == ("external_launcher" if world > 1 else None)
    assert args["tensor_parallel_size"] == tp
    steps = {"pipeline": cfg.pipeline_depth, "ppo": cfg.k, "sync": 1}[mode]
    assert seqs == steps * 768 // (world // tp) and args["max_num_seqs"] == max(256, seqs)
    assert args["enable_chunked_prefill"] == cuda  # CPU generators cannot rewind after a chunk
    assert args.get("max_num_batched_tokens") == (max(8192, args["max_num_seqs"]) if cuda else None)
    assert args["enable_sleep_mode"] == (cuda and mode != "pipeline")  # pipeline keeps its KV across updates
    assert args["enable_prefix_caching"] == (cuda or mode != "pipeline")
    assert args["gpu_memory_utilization"] == 0.61
    assert (args["kv_cache_memory_bytes"] is None) == cuda and args["enforce_eager"] == (not cuda)
    assert args["hf_overrides"] == {"head_dtype": "float32"} and args["logprobs_mode"] == "processed_logprobs"


def test_vllm_memory_wins_over_the_plan():
    cfg = config.parse_args(["--model", "m", "--vllm_memory", "0.3"])
    assert generate.engine_args(cfg, "m", "cuda", devices.Layout(), 100, True, gpu_memory=0.7)[
        "gpu_memory_utilization"] == 0.3


def test_placement_and_shared_folder_checks_are_one_line(tmp_path):
    devices.check_engine_device("cuda:3", "cuda:3", 3)
    with pytest.raises(RuntimeError, match="cuda:0, not on its own device cuda:3") as e:
        devices.check_engine_device("cuda:3", "cuda:0", 3)
    assert "\n" not in str(e.value)
    token = (tmp_path / "shared")
    token.write_text("abc")
    devices.check_shared_dir(str(token), "abc", 1, "host")
    for path, want in ((token, "xyz"), (tmp_path / "missing", "abc")):
        with pytest.raises(RuntimeError, match="--out_dir must be on storage every machine shares"):
            devices.check_shared_dir(str(path), want, 1, "host")


def _budget(**kw):
    base = dict(longest=2048 + 12288 + 16 + 2048, micro_batch_tokens=16384, chunk_tokens=1024, checkpointing=True,
                seqs_in_flight=192, sleeps=False)
    return devices.Budget(**{**base, **kw})


def test_memory_plan_of_the_paper_recipe():
    """Qwen3-8B on 8 x 80 GB at the paper's lengths fits only with checkpointing and chunks; every item is the
    documented arithmetic; the KV cache holds whole longest sequences."""
    q8 = devices.QWEN3["Qwen3-8B"]
    plan = devices.plan_memory(q8, _budget(), 80 * 10**9, 8, 8, 1)
    assert not plan.problem, plan.problem
    positions = 2048 + 12288 + 16 + 2048  # the longest sequence exceeds the micro-batch budget: it goes alone
    assert plan.trainer["activations"] == 2 * 4096 * 36 * positions + 34 * 4096 * positions
    assert plan.trainer["states"] == 16 * q8.params // 8
    assert plan.trainer["root unit"] == 8 * 2 * 151936 * 4096  # embedding and head, untied, fp32 + gradient
    assert plan.trainer["head chunks"] == 16 * 1024 * 151936 + 4 * positions * 4096
    assert abs(plan.vllm_fraction * plan.total - (plan.total - plan.trainer_peak)) < 1
    assert plan.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    assert plan.decoding_at_once == plan.kv_tokens // positions and 1 <= plan.decoding_at_once < 192
    line = plan.lines()
    assert "Trainer peak" in line and f"{plan.kv_tokens:,} tokens" in line and "\n" not in line
    # asleep while the trainer runs (sync, PPO), vLLM gets all but the trainer's resident states
    asleep = devices.plan_memory(q8, _budget(sleeps=True), 80 * 10**9, 8, 8, 1)
    assert asleep.vllm_fraction > plan.vllm_fraction and asleep.kv_tokens > plan.kv_tokens


@pytest.mark.parametrize("change,flag", [
    (dict(budget=dict(checkpointing=False)), "--activation_checkpointing"),  # 76 GiB of activations
    (dict(budget=dict(chunk_tokens=200_000, micro_batch_tokens=200_000)), "--logprob_chunk_tokens"),
    (dict(world=1), "more GPUs"),  # 16 bytes per parameter of 8B on one GPU
    (dict(vllm_fraction=0.2), "raise --vllm_memory"),  # 16 GB: the weights and no room for one sequence
    (dict(tp=1, total=40), "--tp"),
])
def test_memory_plan_refuses_what_cannot_fit_naming_the_flag(change, flag):
    q8 = devices.QWEN3["Qwen3-8B"]
    world = change.get("world", 8)
    plan = devices.plan_memory(q8, _budget(**change.get("budget", {})), change.get("total", 80) * 10**9, world,
                               world, change.get("tp", 1), change.get("vllm_fraction", 0.0))
    assert plan.problem and flag in plan.problem and "\n" not in plan.problem


def test_paper_table_runs():
    table = devices.paper_table()
    assert table.count("\n") == 8 and "Qwen3-8B | 8 x 141 GB" in table
    assert "4 + 4 split | pipeline | 51.7 | 0.90 | 50.4 | 366,740 | 22 / 384 | yes" in table  # 9 at once colocated
    assert "6 + 2 split" in table and "change fewer --generators" in table  # two trainers cannot hold 8B's states


def test_split_roles_plan_their_gpu_alone_and_a_lone_generator_engine_keeps_its_device():
    shape = devices.QWEN3["Qwen3-8B"]
    budget = devices.Budget(16400, 16384, 1024, True, 192, sleeps=False)
    trainer = devices.plan_memory(shape, budget, 80 * 10**9, 4, 4, 1, role="trainer")
    generator = devices.plan_memory(shape, budget, 80 * 10**9, 4, 4, 1, role="generator")
    assert trainer.vllm_fraction == 0 and not trainer.problem and trainer.trainer["states"] == 16 * shape.params // 4
    assert generator.trainer_peak == 0 and generator.vllm_fraction == 0.9 and not generator.problem
    cfg = config.parse_args(["--model", "m"])
    lone = devices.Layout(0, 1, 3, 1, 1)  # generator rank on cuda:3, a world of its own
    assert generate.engine_args(cfg, "m", "cuda", lone, 100, True)["distributed_executor_backend"] == \
        "external_launcher"
    assert generate.engine_args(cfg, "m", "cpu", lone, 100, True)["distributed_executor_backend"] is None


def _seeded_model(layers=4):
    """SmolLM2-135M's shape (hidden 576, 9 heads of 64, 3 KV heads, MLP 1536, vocabulary 49,152, tied
    embeddings), fewer layers, random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                      num_hidden_layers=layers, vocab_size=49152, tie_word_embeddings=True,
                      max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000)
    return LlamaForCausalLM(cfg).float()


def _world_of_one():
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def test_chunked_head_and_checkpointing_give_the_same_gradient():
    """Log-probs in chunks of 64 positions with every decoder layer checkpointed, against one chunk and no
    checkpointing, through FSDP2 on a model of SmolLM2's shape: log-probs, entropies and every gradient agree
    within 1e-5."""
    _world_of_one()
    rows = [[(list(range(5, 25)), list(range(100, 300))), (list(range(7, 12)), list(range(900, 960)))],
            [(list(range(40, 47)), list(range(2000, 2123)))]]
    results = []
    for checkpointing, chunk in ((True, 64), (False, 0)):
        model = policy.build(_seeded_model(), torch.device("cpu"), torch.float32, True, None, checkpointing, chunk)
        logp, entropy = policy.completion_logprobs(model, rows, 1.0, 0)
        weights = torch.linspace(-1, 1, len(logp))
        (logp * weights).sum().backward()
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        results.append((logp.detach(), entropy, grads))
    (a_logp, a_ent, a_grads), (b_logp, b_ent, b_grads) = results
    assert len(a_logp) == 200 + 60 + 123  # more than one chunk of 64
    assert (a_logp - b_logp).abs().max() < 1e-5 and (a_ent - b_ent).abs().max() < 1e-5
    assert a_grads.keys() == b_grads.keys() and max(g.abs().max() for g in a_grads.values()) > 1e-3
    assert max((a_grads[n] - b_grads[n]).abs().max().item() for n in a_grads) < 1e-5


def test_weights_are_gathered_in_the_engine_dtype():
    _world_of_one()
    model = policy.build(_seeded_model(layers=1), torch.device("cpu"), torch.float32, True)
    full = dict(policy.full_weights(model, torch.bfloat16))
    assert all(t.dtype == torch.bfloat16 and not hasattr(t, "full_tensor") for t in full.values())
    assert "lm_head.weight" not in full and "model.embed_tokens.weight" in full  # tied: sent once
    assert full["model.norm.weight"].shape == (576,)


def test_prefix_cache_is_salted_by_weight_version(toy_rows, toy_path, tokenizer):
    """With the GPU's choice (prefix caching on, in pipeline mode too): the answer phase reuses its own prompt and
    thinking from the cache instead of prefilling them again, and a prompt's KV is reused by requests submitted at
    the same weight version only."""
    train, _, _ = toy_rows
    cfg = config.parse_args(["--think_min_tokens", "120", "--think_max_tokens", "120", "--prompt_max_tokens", "160"])
    gen = generate.Generator(cfg, toy_path, tokenizer, "cpu", updates_in_flight=True, prefix_caching=True)
    try:
        gen.min_tokens = 120  # every completion thinks 120 tokens, then answers in a second request
        block = gen.engine.vllm_config.cache_config.block_size  # only whole blocks are cached (128 on CPU)
        prompt = (train[0]["prompt_ids"] * 50)[:150]  # longer than a block (a 3-term prompt is ~13 tokens)
        hits = []
        for version in (0, 0, 1):  # the same group (same seeds) twice at version 0, then at version 1
            gen.set_version(version)
            before = dict(gen.cached_tokens)
            gen.submit("a", 0, prompt, "0", 2, serial=0)
            gen.run_until_done({"a"})
            hits.append({phase: gen.cached_tokens[phase] - before[phase] for phase in (0, 1)})
        thought = len(prompt) + 120 - 1  # the KV the thinking request computed (not its last token's)
        assert [h[1] for h in hits] == [2 * (thought // block * block)] * 3 and thought >= 2 * block  # not re-prefilled
        # the prompt's block: the group's second completion shares its first's; again at version 0 both find it
        # cached; at version 1 only the second finds the first's again: nothing from version 0 is reused
        assert [h[0] for h in hits] == [block, 2 * block, block]
    finally:
        gen.close()


def test_reload_warnings_hide_only_layers_with_nothing_to_reload():
    import logging

    def record(layer):
        return logging.LogRecord("vllm.model_executor.model_loader.reload.layerwise", logging.WARNING, "x", 1,
                                 "%s: Failed to load weights", (layer,), None)
    tied, untied = generate._ExpectedReloadWarnings(True), generate._ExpectedReloadWarnings(False)
    assert not tied.filter(record("RotaryEmbedding")) and not untied.filter(record("Llama3RotaryEmbedding"))
    assert not tied.filter(record("ParallelLMHead")) and untied.filter(record("ParallelLMHead"))  # re-tied if tied
    assert tied.filter(record("QKVParallelLinear")) and untied.filter(record("RowParallelLinear"))  # a real failure


def test_the_plan_counts_the_sampler_rows_vllm_allocates():
    """vLLM sizes its sampler for max_num_seqs = max(256, sequences in flight) (engine_args), not for fewer."""
    q8 = devices.QWEN3["Qwen3-8B"]
    few, many = (devices.plan_memory(q8, _budget(seqs_in_flight=n), 80 * 10**9, 8, 8, 1) for n in (96, 1024))
    assert few.vllm_overhead == 8 * 256 * 151936 + GIB and many.vllm_overhead == 8 * 1024 * 151936 + GIB


def test_devices_py_takes_help_and_refuses_anything_else():
    import subprocess
    import sys
    from conftest import ROOT
    helped = subprocess.run([sys.executable, "devices.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert helped.returncode == 0 and "memory plan" in helped.stdout
    bad = subprocess.run([sys.executable, "devices.py", "--model", "x"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr == "error: unrecognized arguments: --model x\n" and not bad.stdout

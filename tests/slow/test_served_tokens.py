"""What `athanor serve` answers is what HF transformers computes, request by request, through chunked prefill,
prefix caching and preemption.

One real server (smollm2-135m, fp32, CPU) with 4 slots, a step budget of 48 tokens, so every long prompt is
prefilled in several chunks whose boundaries fall inside it, and a KV pool of 160 tokens (10 pages), too small
for four sequences of this length at once, so the scheduler preempts some and they recompute later; 24 greedy
requests in three waves of 8 concurrent ones. The prompts share a long preamble, and the second and third waves
are the next turns of the first's conversations (the history, the answer, a new message), so most of their
prompts sit in cached pages already and each hit ends inside a page (the rest of that page is recomputed). Each
answer is checked against HF's greedy continuation of the same token ids, run one request at a time.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
import torch
from openai import AsyncOpenAI

from athanor.serve.launch import ServerProcess

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
MAX_TOKENS = 8
PREAMBLE = (
    "You are a careful assistant. Answer in one short sentence. The following notes describe a small town by a "
    "river: it has a market on Saturdays, a bridge built of red stone, two bakeries, a library that opens late on "
    "Thursdays, and a ferry that crosses to the island every hour in summer. "
)
QUESTIONS = ["Where is the market?", "What is the bridge made of?", "How many bakeries are there?",
             "When does the library open late?", "How often does the ferry run?", "What crosses the river?",
             "What happens on Saturdays?", "Name one building in the town."]


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    assert match, f"{name} is not in /metrics"
    return float(match.group(1))


def test_served_greedy_tokens_equal_hf_transformers(tmp_path: Path, smollm2_gguf: Path) -> None:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name,
                                                           torch_dtype=torch.float32).eval()

    def hf_answer(ids: list[int]) -> list[int]:
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        return out[0, len(ids):].tolist()

    server = ServerProcess(["--model", MODEL, "--device", "cpu", "--max-seqs", "4", "--max-seq-len", "160",
                            "--kv-tokens", "160", "--max-num-batched-tokens", "48"], tmp_path / "server.log").start()
    try:
        async def ask(client: AsyncOpenAI, ids: list[int]) -> str:
            r = await client.completions.create(model=MODEL, prompt=ids, max_tokens=MAX_TOKENS, temperature=0,
                                                extra_body={"ignore_eos": True})
            return r.choices[0].text

        async def wave(prompts: list[list[int]]) -> list[str]:
            client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
            return list(await asyncio.gather(*(ask(client, ids) for ids in prompts)))

        base = tokenizer.encode(PREAMBLE)
        prompts = [base + tokenizer.encode(" " + q) for q in QUESTIONS]
        checked = 0
        for turn in range(3):
            answers = asyncio.run(wave(prompts))
            for ids, text in zip(prompts, answers):
                assert text == tokenizer.decode(hf_answer(ids), skip_special_tokens=True), f"turn {turn}, {len(ids)} tokens"
                checked += 1
            # The next turn: the history, the answer as the server gave it, one more message.
            prompts = [ids + tokenizer.encode(text) + tokenizer.encode(" And then?") for ids, text in
                       zip(prompts, answers)]
        assert checked == 24
        metrics = httpx.get(f"{server.url}/metrics").text
        prompt_tokens = _metric(metrics, "athanor_prompt_tokens_total")
        computed = _metric(metrics, "athanor_prefill_tokens_total")
        # The later turns' histories were in the pages of the earlier ones, preemptions' recomputation included.
        assert computed < 0.8 * prompt_tokens, (computed, prompt_tokens)
        assert _metric(metrics, "athanor_num_preemptions_total") >= 1
    finally:
        server.stop()

"""Record SmolLM2-135M-Instruct token traces for replaying speculative drafts.

The first 12 prompts of examples/tasks/code.jsonl, each sampled 16 times with
the model's chat template, at one temperature, top-p 0.9, at most 192 tokens, one
seed per sample, on vLLM's CPU build in one offline batch (heddle run's local
workers write the same format at ~14-20 tokens/s on two shared cores). Lines
follow the heddle-trace format (docs/workloads.md, "Token traces") with the
fields a replay reads; timings are not recorded.

    flock /work/vllm.lock python examples/spec-trace/record.py 1.0 code-t10.trace.jsonl.gz
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
HERE = Path(__file__).resolve().parent
TASKS = HERE.parent / "tasks"
SAMPLES = 16


def main() -> None:
    temperature, out = float(sys.argv[1]), Path(sys.argv[2])
    from vllm import LLM, SamplingParams  # noqa: PLC0415 - only this script needs vLLM

    from heddle.worker import ensure_smollm2  # noqa: PLC0415

    tasks = []
    lines = (TASKS / "code.jsonl").read_text(encoding="utf-8").splitlines()
    tasks += [json.loads(line) for line in lines[:12]]
    llm = LLM(
        str(ensure_smollm2(None, install=False)),
        enforce_eager=True,
        max_model_len=1024,
        seed=0,
        max_num_seqs=48,
    )
    tok = llm.get_tokenizer()
    prompts, meta = [], []
    for t in tasks:
        text = tok.apply_chat_template(
            [{"role": "user", "content": t["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        ids = tok.encode(text, add_special_tokens=False)
        for s in range(SAMPLES):
            prompts.append({"prompt_token_ids": list(ids)})
            meta.append((t["id"], s, list(ids)))
    params = [
        SamplingParams(temperature=temperature, top_p=0.9, max_tokens=192, seed=1000 * i + 7)
        for i in range(len(prompts))
    ]
    outputs = llm.generate(prompts, params)
    with gzip.open(out, "wt", encoding="utf-8") as f:
        for (task, sample, ids), o in zip(meta, outputs, strict=True):
            c = o.outputs[0]
            f.write(
                json.dumps(
                    {
                        "task_id": task,
                        "sample": sample,
                        "format": "heddle-trace",
                        "version": 1,
                        "group": task,
                        "trajectory_id": f"{task}-s{sample:03d}",
                        "status": "done",
                        "finish_reason": c.finish_reason,
                        "temperature": temperature,
                        "top_p": 0.9,
                        "steps": [
                            {
                                "turn": 0,
                                "input_token_ids": ids,
                                "output_token_ids": list(c.token_ids),
                                "finish_reason": c.finish_reason,
                            }
                        ],
                    },
                    separators=(",", ":"),
                )
                + "\n"
            )
    print(f"wrote {len(outputs)} samples to {out}")


if __name__ == "__main__":
    main()

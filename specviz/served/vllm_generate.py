"""Batched greedy generation in vLLM for drafter training data (docs/served.md).

Run by the vLLM virtualenv's interpreter (``.venv-vllm``), never imported by specviz (vLLM pins
another transformers):

    .venv-vllm/bin/python specviz/served/vllm_generate.py REQUEST.json REPLIES.jsonl

REQUEST.json: ``{"model": DIR_OR_ID, "max_tokens": N, "temperature": T, "seed": S,
"max_model_len": L, "prompts": [{"key": ..., "ids": [...]}, ...]}`` (token ids, chat template
already applied by specviz). REPLIES.jsonl: one ``{"key", "reply_ids", "finish_reason"}`` per
prompt, then a last line ``{"stats": {"new_tokens", "generate_s", "load_s"}}``: generation time
alone (the engine's start is reported apart). vLLM's offline engine spawns its own process, so
everything runs under ``if __name__ == "__main__"``.
"""
import json
import sys
import time


def main(request_path: str, out_path: str) -> int:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    req = json.load(open(request_path, encoding="utf-8"))
    t0 = time.perf_counter()
    llm = LLM(model=req["model"], dtype="float32", enforce_eager=True,
              max_model_len=int(req.get("max_model_len", 4096)), seed=int(req.get("seed", 0)))
    load_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=int(req["max_tokens"]),
                            temperature=float(req.get("temperature", 0.0)),
                            seed=int(req.get("seed", 0)))
    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p["ids"]]) for p in req["prompts"]]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=True)
    gen_s = time.perf_counter() - t0
    new = 0
    with open(out_path, "w", encoding="utf-8") as fh:
        for p, o in zip(req["prompts"], outs):
            c = o.outputs[0]
            new += len(c.token_ids)
            fh.write(json.dumps({"key": p["key"], "reply_ids": list(c.token_ids),
                                 "finish_reason": c.finish_reason}) + "\n")
        fh.write(json.dumps({"stats": {"new_tokens": new, "generate_s": round(gen_s, 3),
                                       "load_s": round(load_s, 3)}}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

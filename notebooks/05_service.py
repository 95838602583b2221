# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · The HTTP service
#
# Starts the service (`litestar run`) in the background on a free loopback port, calls it with the
# `openai` client for embeddings and plain `httpx` for rerank, checks the vectors against the
# in-process encoder, and stops the service.

# %%
import secrets

import httpx
import numpy as np
import openai
import pandas as pd

from embedrank import Encoder
from embedrank.testing.launch import running_server

key = secrets.token_urlsafe(16)
server = running_server({"EMBEDRANK_API_KEYS": key, "HF_HUB_OFFLINE": "1"})
base_url = server.__enter__()
print("service ready at", base_url, "| health:", httpx.get(f"{base_url}/health").json())

# %%
client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=key)
texts = ["What causes the seasons?", "The tilt of Earth's axis causes the seasons.", "Bananas are rich in potassium."]
resp = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=texts)
http_vectors = np.array([d.embedding for d in resp.data], dtype=np.float32)
print(f"{len(resp.data)} vectors of dimension {http_vectors.shape[1]}; usage: {resp.usage}")

# %%
local = Encoder.from_pretrained().encode(texts)
print("max |HTTP - in-process| =", float(np.abs(http_vectors - local).max()))
assert np.allclose(http_vectors, local, atol=1e-5)

# %%
headers = {"Authorization": f"Bearer {key}"}
body = {"model": "sentence-transformers/all-MiniLM-L6-v2", "query": texts[0],
        "documents": [{"text": t} for t in texts[1:]] + ["Summer is warm because the sun is higher in the sky."],
        "return_documents": True}
rerank = httpx.post(f"{base_url}/v1/rerank", json=body, headers=headers).json()
print("id:", rerank["id"], "| usage:", rerank["usage"])
pd.DataFrame([{"index": r["index"], "relevance_score": round(r["relevance_score"], 4), "text": r["document"]["text"]}
              for r in rerank["results"]])

# %%
models = httpx.get(f"{base_url}/v1/models", headers=headers).json()["data"]
unauthorized = httpx.post(f"{base_url}/v1/rerank", json=body)
print("without a key:", unauthorized.status_code, unauthorized.json()["error"]["message"])
pd.DataFrame(models)[["id", "capabilities", "scorer", "dimension", "max_tokens"]]

# %%
server.__exit__(None, None, None)
try:
    httpx.get(f"{base_url}/health", timeout=2)
    print("still running?")
except httpx.HTTPError:
    print("service stopped")

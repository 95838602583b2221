#!/usr/bin/env python
"""Images per second of image-text models: embedrank against sentence-transformers, in-process and through
the service.

    python -m eval bench images                      # ViT-B/32 CLIP and SigLIP base, 128 images (make bench NAME=images)
    python -m eval bench images --images 64 --rounds 2 --models clip

The models are the real architectures at their real sizes (``transformers``' default ``CLIPConfig`` is
openai/clip-vit-base-patch32's, ``SiglipConfig`` google/siglip-base-patch16-224's) with seeded random weights
and the families' default image processors: speed does not depend on the weights. The images are photos'
size (640 x 480, drawn shapes on noise), the same for every system.

- **in-process**: ``SentenceTransformer.encode(images, batch_size=32)`` and embedrank's
  ``ImageTextEncoder.encode_images`` at the same batch size from the same PIL images, on each runtime
  (torch fp32, OpenVINO fp32, the default; OpenVINO bf16), alternated round by round (A B A B), medians;
- **service**: ``/v1/embeddings`` on a ``litestar run`` server serving the model (its default runtime), 4
  clients each sending 8 JPEG images a request as data URLs (decoded, checked and preprocessed by the server),
  against the same runtime in-process on the same images decoded.

Prints a table per model and one ``goal`` line per model: embedrank's default in-process against
sentence-transformers (goal >= 1.5x).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from embedrank.paths import build_directory, default_cache_dir  # noqa: E402

KEY = "bench-images"
MODELS = ("clip", "siglip")
NAMES = {"clip": "ViT-B/32 CLIP", "siglip": "SigLIP base (patch16-224)"}


def full_size_model(family: str) -> str:
    """The family's real-size model with seeded random weights and its default processor, built once."""
    import torch
    import transformers

    from embedrank.testing.tiny_images import IMAGE_TEXT_ARCHITECTURES, _tokenizer

    out = default_cache_dir() / "models" / f"bench-{family}-base-random-{transformers.__version__}"
    if (out / "config.json").is_file():
        return str(out)

    def build(tmp: Path) -> None:
        tokenizer = _tokenizer(IMAGE_TEXT_ARCHITECTURES[family])
        config = transformers.CLIPConfig() if family == "clip" else transformers.SiglipConfig()
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            setattr(config.text_config, name, getattr(tokenizer, name, None))
        torch.manual_seed(0)
        model = (transformers.CLIPModel if family == "clip" else transformers.SiglipModel)(config).eval()
        model.save_pretrained(tmp)
        images = transformers.CLIPImageProcessorPil() if family == "clip" else transformers.SiglipImageProcessorPil()
        processor = transformers.CLIPProcessor if family == "clip" else transformers.SiglipProcessor
        processor(image_processor=images, tokenizer=tokenizer).save_pretrained(tmp)

    return build_directory(out, build)


def photos(n: int) -> list:
    from embedrank.testing.tiny_images import DRAWN, drawn_image

    return [drawn_image(DRAWN[i % 6][1], DRAWN[i % 6][2], size=(640, 480), seed=i) for i in range(n)]


def jpeg_url(image) -> str:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


def timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


async def serve_rate(base: str, urls: list[str], clients: int, per_request: int) -> float:
    import httpx

    requests = [urls[i : i + per_request] for i in range(0, len(urls), per_request)]
    queue: asyncio.Queue = asyncio.Queue()
    for r in requests:
        queue.put_nowait(r)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            batch = queue.get_nowait()
            resp = await http.post(f"{base}/v1/embeddings", json={"model": "m", "input": batch}, timeout=600)
            resp.raise_for_status()

    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(headers=headers) as http:
        await http.post(f"{base}/v1/embeddings", json={"model": "m", "input": urls[:2]}, timeout=600)  # warm
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return len(urls) / (time.perf_counter() - started)


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--images", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3, help="alternated rounds (median)")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--per-request", type=int, default=8)
    p.add_argument("--no-service", action="store_true", help="in-process only")
    args = p.parse_args(argv)
    import logging
    import warnings

    logging.getLogger("embedrank").setLevel(logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    from sentence_transformers import SentenceTransformer

    from embedrank import ImageTextEncoder, read_image
    from embedrank.testing.launch import running_server

    images = photos(args.images)
    urls = [jpeg_url(image) for image in images]
    decoded = [read_image(url) for url in urls]  # the JPEGs the service is sent, for its in-process baseline
    print(f"{args.images} images of 640 x 480, batch size {args.batch_size}, {args.rounds} alternated rounds (median)")
    for family in args.models:
        path = full_size_model(family)
        st = SentenceTransformer(path, device="cpu")
        systems = {
            "sentence-transformers (torch fp32)": lambda b, st=st: st.encode(b, batch_size=args.batch_size),
        }
        ours = {
            "embedrank torch fp32": ImageTextEncoder.from_pretrained(path, backend="torch"),
            "embedrank openvino fp32 (default)": ImageTextEncoder.from_pretrained(path),
            "embedrank openvino bf16": ImageTextEncoder.from_pretrained(path, backend="openvino", precision="bf16"),
        }
        for name, model in ours.items():
            systems[name] = lambda b, m=model: m.encode_images(b, batch_size=args.batch_size)
        for run in systems.values():  # warm up: first calls compile and allocate
            run(images[: args.batch_size])
        seconds: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(args.rounds):
            for name, run in systems.items():
                seconds[name].append(timed(lambda run=run: run(images)))
        rates = {name: args.images / statistics.median(s) for name, s in seconds.items()}
        reference = rates["sentence-transformers (torch fp32)"]
        print(f"\n{NAMES[family]} ({ours['embedrank openvino bf16'].runtime.inference_precision} where bf16 asked)")
        print("| system | images/s | x sentence-transformers |")
        print("|---|---|---|")
        for name, rate in rates.items():
            print(f"| {name} | {rate:.1f} | {rate / reference:.2f} |")
        default = ours["embedrank openvino fp32 (default)"]
        if not args.no_service:
            env = {"EMBEDRANK_API_KEYS": KEY, "HF_HUB_OFFLINE": "1", "EMBEDRANK_MODELS": f"m={path}"}
            env["EMBEDRANK_MAX_IMAGES"] = str(args.per_request)
            with running_server(env, timeout=600) as base:
                served, inproc = [], []
                for _ in range(args.rounds):
                    served.append(asyncio.run(serve_rate(base, urls, args.clients, args.per_request)))
                    inproc.append(
                        args.images / timed(lambda m=default: m.encode_images(decoded, batch_size=args.batch_size))
                    )
            share = statistics.median(served) / statistics.median(inproc)
            print(
                f"| service, {args.clients} clients x {args.per_request} JPEG data URLs (default runtime) | "
                f"{statistics.median(served):.1f} | {statistics.median(served) / reference:.2f} |"
            )
            print(f"service: {share:.0%} of the same runtime in-process on the same images decoded")
        ratio = rates["embedrank openvino fp32 (default)"] / reference
        print(f"goal {family}: embedrank (default) >= 1.5x sentence-transformers in-process: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(run())

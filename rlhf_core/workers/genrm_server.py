"""The judge of a generative reward model (GenRM), served on this machine by the hf engine as an OpenAI-compatible
chat endpoint: verl 0.9's reward loop serves it with vLLM/SGLang behind a router and hands the router's
``host:port`` to the user's reward function (``reward_router_address``), which posts
``{"messages": [...], "temperature": ..., "max_tokens": ...}`` to ``http://<address>/v1/chat/completions`` and
parses ``choices[0].message.content`` (verl ``docs/advance/reward_loop.rst``,
``tests/experimental/reward_loop/reward_fn.py``).

* :class:`JudgeEngine`: the judge (``AutoModelForCausalLM`` in ``dtype``, on CPU) and its tokenizer; one request →
  its chat template (``add_generation_prompt=True``; vLLM's ``chat_template_kwargs`` passed on) → the hf engine's
  decode loop (:func:`~rlhf_core.workers.rollout.hf_decode.decode`; ``model.generate`` for a model it does not
  support) → an OpenAI ``chat.completion`` dict.
* :class:`GenRMServer`: a ``ThreadingHTTPServer`` bound to ``127.0.0.1`` only, on a port the OS picks free, in a
  daemon thread; ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``. Requests are answered one at
  a time, in arrival order (a lock; vLLM batches them).
* :func:`start_genrm` / :func:`genrm_kwargs`: a run's judge from its config (:func:`judge_defaults`), and the two
  arguments its reward function gets. (Here, not in ``rlhf_core.reward``: the judge needs the models, kernels and
  the rollout's decode loop, which sit above the reward package; ``rlhf_core.reward.genrm`` holds the config side.)

Sampling, as verl's vLLM server (``override_generation_config``): a request's own ``temperature``, ``top_p``,
``top_k``, ``max_tokens`` (or ``max_completion_tokens``) win; missing ones take the engine's defaults
(``reward.reward_model.rollout.{temperature,top_p,top_k,response_length}``). Here also ``do_sample=False`` makes the
default temperature 0, and ``ignore_eos`` is the default of the request's ``ignore_eos``. ``temperature == 0`` is
greedy (vLLM). Draws come from the engine's own generator, seeded once with ``seed`` (vLLM's engine seed), or from
``seed`` of the request when it gives one.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from rlhf_core.reward.genrm import engine_settings

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"  # loopback only: the judge answers this machine, never the network
NO_CONTEXT_LIMIT = 1 << 30  # JudgeEngine.max_model_len when neither the config nor the judge's config names one
UNSUPPORTED = ("stream", "tools", "logprobs", "top_logprobs", "stop", "response_format", "logit_bias")


class RequestError(ValueError):
    """A request the server refuses (answered with HTTP ``status`` and an OpenAI-style error body)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class JudgeDefaults:
    """The engine-level settings of the judge (``reward.reward_model.rollout.*``, legacy ``reward_model.rollout.*``
    merged in). ``top_k``: -1 or 0 = off. ``max_model_len``: prompt + completion tokens; None = the judge's
    ``max_position_embeddings`` (verl's vLLM server)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    ignore_eos: bool = False
    response_length: int = 2048
    max_model_len: int | None = None
    seed: int = 42
    dtype: str = "bfloat16"


class JudgeEngine:
    """The judge model answering chat requests with the hf engine's decode loop.

    Args:
        path: a local model folder (a causal LM with a tokenizer that has a chat template).
        defaults: :class:`JudgeDefaults`. served_names: the ``model`` values a request may name (vLLM refuses
            others with 404); a request without ``model`` is served.
    Raises:
        ValueError: ``defaults.max_model_len`` below 1 (before loading) or above the judge's
            ``max_position_embeddings`` (verl's check).
    """

    def __init__(self, path: str, defaults: JudgeDefaults, served_names: tuple[str, ...] = ()) -> None:
        if defaults.max_model_len is not None and defaults.max_model_len < 1:
            raise ValueError(f"reward.reward_model.rollout.max_model_len={defaults.max_model_len} must be >= 1 "
                             "(null: the judge's max_position_embeddings)")
        from rlhf_core import kernels
        from rlhf_core.models.loading import load_causal_lm, load_tokenizer
        from rlhf_core.workers.rollout.hf_decode import supports_lean_decode
        from rlhf_core.workers.rollout.hf_rollout import eos_ids_of

        kernels.install()  # the decode loop's attention functions, as every engine registers them at set-up
        self.path, self.defaults = path, defaults
        self.served_names = tuple(dict.fromkeys((*served_names, path)))
        self.tokenizer = load_tokenizer(path)
        self.model = load_causal_lm(path, defaults.dtype).eval()
        self.eos_ids = eos_ids_of(self.model, self.tokenizer)
        self.lean = supports_lean_decode(self.model)
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if defaults.max_model_len is not None and limit is not None and defaults.max_model_len > limit:
            raise ValueError(f"reward.reward_model.rollout.max_model_len={defaults.max_model_len} is above the judge's "
                             f"max_position_embeddings={limit} ({path})")
        # which bound applies: the configured max_model_len when set; else the judge's max_position_embeddings
        # (verl's vLLM server); else (a config without it) no bound of ours, NO_CONTEXT_LIMIT
        if defaults.max_model_len is not None:
            self.max_model_len = int(defaults.max_model_len)
        elif limit is not None:
            self.max_model_len = int(limit)
        else:
            self.max_model_len = NO_CONTEXT_LIMIT
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(defaults.seed))
            self._rng_state = torch.get_rng_state()  # the engine's stream, kept apart from the caller's RNG
        self._lock = threading.Lock()

    def _sampling(self, request: dict) -> tuple[bool, float, int, float]:
        d = self.defaults
        temperature = float(request["temperature"] if request.get("temperature") is not None
                            else (d.temperature if d.do_sample else 0.0))
        top_p = float(request["top_p"] if request.get("top_p") is not None else d.top_p)
        top_k = int(request["top_k"] if request.get("top_k") is not None else d.top_k)
        if temperature < 0 or not 0 < top_p <= 1:
            raise RequestError(f"temperature={temperature} must be >= 0 and top_p={top_p} in (0, 1]")
        return temperature > 0, temperature, max(top_k, 0), top_p

    def _prompt_ids(self, request: dict) -> list[int]:
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError("'messages' must be a non-empty list of {'role': ..., 'content': ...} objects")
        kwargs = dict(request.get("chat_template_kwargs") or {})
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def chat(self, request: dict) -> dict:
        """One OpenAI chat request → a ``chat.completion`` dict: :meth:`_chat` under the engine's lock (requests are
        served one at a time, in arrival order; the tokenizer is not shared between threads either).

        Raises:
            RequestError: as :meth:`_chat`.
        """
        with self._lock:
            return self._chat(request)

    def _chat(self, request: dict) -> dict:
        """One OpenAI chat request → a ``chat.completion`` dict (``choices[i].message.content``,
        ``finish_reason`` ``stop``/``length``, ``usage``).

        Raises:
            RequestError: 404 for a ``model`` not served; 400 for a field this server does not implement
                (``stream``, ``tools``, ``logprobs``, ``stop``, ...), bad messages or sampling values, ``n < 1``, or a
                prompt plus ``max_tokens`` longer than ``max_model_len`` (vLLM's message).
        """
        model = request.get("model")
        if model is not None and model not in self.served_names:
            raise RequestError(f"The model `{model}` does not exist; this server serves {list(self.served_names)}", 404)
        bad = [k for k in UNSUPPORTED if request.get(k) not in (None, False, [])]
        if bad:
            raise RequestError(f"the hf judge server does not implement {bad}; drop them from the request")
        do_sample, temperature, top_k, top_p = self._sampling(request)
        n = int(request.get("n") or 1)
        if n < 1:
            raise RequestError(f"n={n} must be >= 1")
        ids = self._prompt_ids(request)
        asked = request.get("max_tokens", request.get("max_completion_tokens"))
        max_tokens = int(self.defaults.response_length if asked is None else asked)
        if max_tokens < 1 or len(ids) + max_tokens > self.max_model_len:
            raise RequestError(f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                               f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the messages, {max_tokens} in "
                               "the completion). Please reduce the length of the messages or completion.")
        ignore_eos = bool(request.get("ignore_eos", self.defaults.ignore_eos))
        tokens = self._generate(ids, n, max_tokens, do_sample, temperature, top_k, top_p, ignore_eos,
                                request.get("seed"))
        choices, completion_tokens = [], 0
        for i, row in enumerate(tokens):
            row = row.tolist()
            ended = next((j for j, t in enumerate(row) if t in self.eos_ids), None) if not ignore_eos else None
            kept = row if ended is None else row[:ended]
            completion_tokens += len(kept) + (ended is not None)
            choices.append({"index": i, "message": {"role": "assistant", "content":
                            self.tokenizer.decode(kept, skip_special_tokens=True)},
                            "finish_reason": "stop" if ended is not None else "length", "logprobs": None})
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": model or self.served_names[0], "choices": choices,
                "usage": {"prompt_tokens": len(ids), "completion_tokens": completion_tokens,
                          "total_tokens": len(ids) + completion_tokens}}

    @torch.no_grad()
    def _generate(self, ids: list[int], n: int, max_tokens: int, do_sample: bool, temperature: float, top_k: int,
                  top_p: float, ignore_eos: bool, seed: Any) -> torch.Tensor:
        """``(n, ≤ max_tokens)`` int64 tokens after the prompt ``ids`` (each row padded after its EOS)."""
        from transformers import GenerationConfig

        from rlhf_core.workers.rollout.hf_decode import decode

        input_ids = torch.tensor([ids] * n, dtype=torch.long)
        mask = torch.ones_like(input_ids)
        eos = [] if ignore_eos else self.eos_ids
        pad = int(self.tokenizer.pad_token_id)
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(int(seed))
            else:
                torch.set_rng_state(self._rng_state)
            if self.lean:
                tokens, _ = decode(self.model, input_ids, mask, max_tokens, eos, pad, do_sample, temperature, top_k,
                                   top_p)
            else:
                cfg = GenerationConfig(do_sample=do_sample, temperature=temperature if do_sample else None,
                                       top_k=top_k if do_sample else None, top_p=top_p if do_sample else None,
                                       max_new_tokens=max_tokens, pad_token_id=pad, eos_token_id=eos or None)
                tokens = self.model.generate(input_ids=input_ids, attention_mask=mask,
                                             generation_config=cfg)[:, len(ids):]
            if seed is None:
                self._rng_state = torch.get_rng_state()
        return tokens


def _handler(engine: JudgeEngine) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # requests go to the debug log, not stderr
            logger.debug("genrm server: " + fmt, *args)

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": "BadRequestError" if status == 400 else
                                          "NotFoundError", "code": status}})

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.rstrip("/") == "/health":
                self._send(200, {"status": "ok"})
            elif self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "rlhf"}
                                                            for name in engine.served_names]})
            else:
                self._error(404, f"no route {self.path}; this server has /v1/chat/completions, /v1/models, /health")

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self._error(404, f"no route {self.path}; this server has /v1/chat/completions")
            try:
                request = json.loads(body or b"{}")
                if not isinstance(request, dict):
                    raise RequestError("the request body must be a JSON object")
                self._send(200, engine.chat(request))
            except json.JSONDecodeError as exc:
                self._error(400, f"the request body is not JSON: {exc}")
            except RequestError as exc:
                self._error(exc.status, str(exc))
            except Exception as exc:  # noqa: BLE001 - the caller gets a 500 with the cause; the server keeps running
                logger.exception("genrm server: request failed")
                self._error(500, f"{type(exc).__name__}: {exc}")

    return Handler


class GenRMServer:
    """:class:`JudgeEngine` behind HTTP on ``127.0.0.1:<free port>``; ``address`` is ``"127.0.0.1:<port>"`` (verl's
    ``reward_router_address``: host and port, no scheme). Use as a context manager, or :meth:`start` /
    :meth:`stop`."""

    def __init__(self, engine: JudgeEngine) -> None:
        self.engine = engine
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """``"127.0.0.1:<port>"``, the bound host and port (no scheme).

        Raises:
            RuntimeError: before :meth:`start` or after :meth:`stop`."""
        if self._httpd is None:
            raise RuntimeError("GenRMServer.address before start()")
        host, port = self._httpd.server_address[:2]
        return f"{host}:{port}"

    def start(self) -> "GenRMServer":
        """Bind ``127.0.0.1`` on a port the OS picks (0: no race with another process for a 'free' port) and serve
        in a daemon thread."""
        self._httpd = ThreadingHTTPServer((HOST, 0), _handler(self.engine))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="genrm-server", daemon=True)
        self._thread.start()
        logger.info("generative reward model %s served at http://%s/v1/chat/completions", self.engine.path,
                    self.address)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> "GenRMServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def judge_defaults(config: Any) -> JudgeDefaults:
    """The :class:`JudgeDefaults` of ``config`` (:func:`~rlhf_core.reward.genrm.engine_settings`)."""
    s = engine_settings(config)
    return JudgeDefaults(temperature=float(s["temperature"]), top_p=float(s["top_p"]), top_k=int(s["top_k"]),
                         do_sample=bool(s["do_sample"]), ignore_eos=bool(s["ignore_eos"]),
                         response_length=int(s["response_length"]),
                         max_model_len=None if s["max_model_len"] is None else int(s["max_model_len"]),
                         seed=int(s["seed"]), dtype=str(s["dtype"]))


def start_genrm(config: Any) -> "GenRMServer":
    """Load the judge and start its server (:class:`GenRMServer`, already started);
    the caller stops it. Served model names: ``reward_model.model.path`` as written and as resolved locally."""
    from rlhf_core.models.loading import local_path

    written = str(config.reward_model.model.path)
    path = local_path(written)
    return GenRMServer(JudgeEngine(path, judge_defaults(config), served_names=(written, path))).start()


def genrm_kwargs(server: Any) -> dict[str, Any]:
    """The keyword arguments the reward function gets in a GenRM run (verl's names)."""
    return {"reward_router_address": server.address, "reward_model_tokenizer": server.engine.tokenizer}

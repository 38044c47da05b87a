"""Python bindings of offgraph (include/offgraph.h) through ctypes.

    import offgraph
    with offgraph.Model("build/kjv-tiny.ogp", backend="cpu") as model:
        for piece in model.generate("In the beginning", max_tokens=32, temperature=0):
            print(piece, end="", flush=True)

    llm = offgraph.Llama(model_path="build/kjv-tiny.ogp")   # llama.cpp's names
    llm.create_completion("In the beginning", max_tokens=16)["choices"][0]["text"]

Generation has no policy here: Model.generate, Session.generate and the
Llama API each make one request of the library's engine (Model.submit,
og_engine_submit), which tokenizes the prompt (special tokens, chat
template), samples, and decides where the output ends.

The shared library liboffgraph.so.<major> is looked for, in this order:
the path in the environment variable OFFGRAPH_LIB; a copy next to this
file (where `pip install .` puts the one it builds); the system's dynamic loader (LD_LIBRARY_PATH, the ld.so cache, what
ctypes.util.find_library finds); /usr/local/lib, where `make install` puts
it by default.

Every failing call raises OffgraphError, whose message is the library's
(og_last_error() or the session's last error) and whose `status` is the
og_status name ("OG_ERR_CAPACITY", ...). Handles (models, sessions,
tokenizers, samplers, decode streams) are freed by close(), by leaving a
`with` block, or when they are garbage collected; a model closes its live
sessions first, a tokenizer its decode streams.
"""

import array
import ctypes
import ctypes.util
import json
import os
import threading
import time
import weakref
from ctypes import (POINTER, Structure, byref, c_bool, c_char_p, c_double, c_float, c_int, c_int32, c_int64,
                    c_size_t, c_uint, c_uint32, c_uint64, c_void_p)

__all__ = ["OffgraphError", "Model", "Session", "Request", "Output", "Tokenizer", "DecodeStream", "Sampler",
           "StepItem", "ToolParser", "Llama", "library_path", "set_log_level", "tool_calls_grammar", "tool_call_id",
           "ABI_MAJOR"]

__version__ = "0.1"

# The SONAME's number: include/offgraph.h's OG_VERSION_MAJOR.
ABI_MAJOR = 0

# og_status, in the order of the enum
_STATUS_NAMES = ["OG_OK", "OG_ERR_INVALID_ARGUMENT", "OG_ERR_OUT_OF_MEMORY", "OG_ERR_INVALID_CONFIG",
                 "OG_ERR_WRITE_TOO_WIDE", "OG_ERR_CAPACITY", "OG_ERR_POSITION", "OG_ERR_UNBOUND", "OG_ERR_IO",
                 "OG_ERR_FORMAT", "OG_ERR_UNSUPPORTED", "OG_ERR_STATE", "OG_ERR_BACKEND", "OG_ERR_NO_DEVICE",
                 "OG_ERR_BUSY"]

_BACKENDS = {"auto": 0, "cpu": 1, "cuda": 2}
_BACKEND_NAMES = {v: k for k, v in _BACKENDS.items()}
# og_dtype, in the order of the enum (include/offgraph.h)
_DTYPES = {"f32": 0, "bf16": 1, "int8": 7, "fp8": 8}  # KV dtypes a session may choose
_DTYPE_NAMES = {0: "f32", 1: "bf16", 2: "f16", 3: "i32", 4: "i64", 5: "q8", 6: "q4", 7: "int8", 8: "fp8",
                9: "q2_k", 10: "q3_k", 11: "q4_k", 12: "q5_k", 13: "q6_k"}
_DTYPE_KEEP = 14  # OG_DTYPE_COUNT: keep the program's kv_dtype
_OUTPUTS = {"none": 0, "logits": 1, "logits_all": 2, "argmax": 3, "sample": 4}
_ADD_SPECIAL = 1
_PARSE_SPECIAL = 2


class OffgraphError(Exception):
    """A call into liboffgraph failed. `status` is the og_status name (None
    for errors found by the bindings before any call), `code` its value."""

    def __init__(self, message, status=None, code=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


# ---------------------------------------------------------------- structs

class _ModelParams(Structure):
    _fields_ = [("backend", c_int), ("n_threads", c_int32), ("cuda_graphs", c_int32), ("tensor_parallel", c_int32),
                ("n_devices", c_int32), ("devices", c_int32 * 8)]


class _SessionParams(Structure):
    _fields_ = [("kv_dtype", c_int), ("kv_allocator", c_void_p)]


class _SamplerParams(Structure):
    _fields_ = [("temperature", c_float), ("top_k", c_int32), ("top_p", c_float), ("min_p", c_float),
                ("repeat_penalty", c_float), ("repeat_last_n", c_int32), ("seed", c_uint64),
                ("presence_penalty", c_float), ("frequency_penalty", c_float), ("logit_bias", c_void_p),
                ("n_logit_bias", c_int32)]


class _KvConfig(Structure):
    _fields_ = [("version", c_int32), ("kv_dtype", c_int), ("max_capacity", c_int64),
                ("initial_capacity", c_int64), ("max_write", c_int32), ("n_model_layers", c_int32),
                ("n_layers", c_int32), ("layers", c_void_p), ("n_states", c_int32), ("states", c_void_p)]


class _KvMetrics(Structure):
    _fields_ = [("length", c_int64), ("n_layers", c_int32), ("rows_allocated", c_int64),
                ("bytes_allocated", c_int64), ("bytes_live", c_int64), ("growth_count", c_int64),
                ("rebinds", c_int64), ("graph_captures", c_int64), ("steps", c_int64),
                ("bytes_shared", c_int64), ("n_states", c_int32), ("bytes_state", c_int64)]


class _ModelMetrics(Structure):
    _fields_ = [("steps", c_int64), ("rows", c_int64), ("graph_captures", c_int64),
                ("bucket_captures", c_int64 * 9), ("bucket_replays", c_int64 * 9),
                ("prepare_seconds", c_double), ("submit_seconds", c_double), ("wait_seconds", c_double),
                ("finish_seconds", c_double)]


class _BatchItem(Structure):
    _fields_ = [("session", c_void_p), ("tokens", POINTER(c_int32)), ("n_tokens", c_int32), ("output", c_int),
                ("logits", POINTER(c_float)), ("sampler", c_void_p), ("token", c_int32),
                ("allowed", POINTER(c_uint32))]  # NULL (every token allowed): ctypes zeroes it


class _EngineParams(Structure):
    _fields_ = [("session", _SessionParams), ("max_sessions", c_int32), ("max_queue", c_int32),
                ("kv_budget", c_int64), ("prefix_cache_bytes", c_int64), ("chunk", c_int32),
                ("step_rows", c_int32), ("seed", c_uint64), ("test_step_delay_s", c_double)]


class _RequestParams(Structure):
    _fields_ = [("kind", c_int), ("text", c_char_p), ("add_special", c_bool), ("tokens", POINTER(c_int32)),
                ("n_tokens", c_int64), ("messages", c_void_p), ("n_messages", c_int32),
                ("add_generation_prompt", c_bool), ("template_vars_json", c_char_p), ("messages_json", c_char_p),
                ("tools_json", c_char_p), ("sampling", _SamplerParams),
                ("max_tokens", c_int64), ("stop", POINTER(c_char_p)), ("n_stop", c_int32), ("ignore_eos", c_bool),
                ("logprobs", c_int32), ("grammar", c_char_p), ("json_schema", c_char_p), ("constraint", c_void_p),
                ("constraint_ctx", c_void_p), ("session", c_void_p)]


class _ChatMessage(Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


_MAX_TOP_LOGPROBS = 20  # OG_MAX_TOP_LOGPROBS


class _TokenLogprob(Structure):
    _fields_ = [("token", c_int32), ("logprob", c_float), ("n_top", c_int32), ("top", c_int32 * _MAX_TOP_LOGPROBS),
                ("top_logprob", c_float * _MAX_TOP_LOGPROBS)]


class _RequestOutput(Structure):
    _fields_ = [("text", c_void_p), ("n_text", c_size_t), ("tokens", POINTER(c_int32)), ("n_tokens", c_int32),
                ("logprobs", c_void_p), ("n_logprobs", c_int32), ("finish", c_int), ("status", c_int),
                ("error", ctypes.c_char * 256), ("prompt_tokens", c_int64), ("reused_tokens", c_int64),
                ("completion_tokens", c_int64), ("t_submit", c_double), ("t_first_token", c_double),
                ("t_end", c_double), ("t_last_token", c_double), ("kv", _KvMetrics)]


class _ToolCall(Structure):
    _fields_ = [("name", c_char_p), ("arguments", c_char_p)]


class _ToolPiece(Structure):
    _fields_ = [("call", c_int), ("name", c_char_p), ("text", c_void_p), ("n", c_size_t), ("last", c_bool)]


# og_tool_format, in the order of the enum
_TOOL_FORMATS = {"none": 0, "hermes": 1, "other": 2, "mistral": 3, "llama3": 4}

_PROMPT_TEXT, _PROMPT_TOKENS, _PROMPT_CHAT = 0, 1, 2
_FINISH_NONE, _FINISH_STOP, _FINISH_LENGTH, _FINISH_CANCELLED, _FINISH_ERROR = range(5)


# ------------------------------------------------------------ the library

_P = c_void_p
_PROTOTYPES = {
    # core
    "og_status_str": (c_char_p, [c_int]),
    "og_last_error": (c_char_p, []),
    "og_free": (None, [c_void_p]),
    "og_log_set_level": (None, [c_int]),
    # models
    "og_model_default_params": (_ModelParams, []),
    "og_model_load": (c_int, [c_char_p, POINTER(_ModelParams), POINTER(_P)]),
    "og_model_destroy": (None, [_P]),
    "og_model_vocab_size": (c_int64, [_P]),
    "og_model_kv_config": (POINTER(_KvConfig), [_P]),
    "og_model_backend": (c_int, [_P]),
    "og_model_tokenizer_config": (c_char_p, [_P]),
    "og_model_step": (c_int, [_P, POINTER(_BatchItem), c_int32]),
    "og_model_metrics_get": (c_int, [_P, POINTER(_ModelMetrics)]),
    # sampling
    "og_sampler_default_params": (_SamplerParams, []),
    "og_sampler_create": (c_int, [POINTER(_SamplerParams), c_int64, POINTER(_P)]),
    "og_sampler_destroy": (None, [_P]),
    "og_sampler_accept": (None, [_P, c_int32]),
    "og_sampler_forbid": (c_int, [_P, c_int32]),
    "og_sampler_reset": (None, [_P]),
    "og_sampler_sample": (c_int32, [_P, POINTER(c_float)]),
    # sessions
    "og_session_default_params": (_SessionParams, []),
    "og_session_create": (c_int, [_P, POINTER(_SessionParams), POINTER(_P)]),
    "og_session_destroy": (None, [_P]),
    "og_session_reset": (None, [_P]),
    "og_session_length": (c_int64, [_P]),
    "og_session_eval": (c_int, [_P, POINTER(c_int32), c_int64, c_int32, POINTER(c_float), c_int]),
    "og_session_eval_next": (c_int, [_P, POINTER(c_int32), c_int64, c_int32, POINTER(c_int32)]),
    "og_session_eval_sample": (c_int, [_P, POINTER(c_int32), c_int64, c_int32, _P, POINTER(c_int32)]),
    "og_session_fork": (c_int, [_P, c_int64, POINTER(_P)]),
    "og_session_save": (c_int, [_P, c_char_p]),
    "og_session_restore": (c_int, [_P, c_char_p, POINTER(_P)]),
    "og_session_restore_into": (c_int, [_P, c_char_p]),
    "og_session_metrics": (c_int, [_P, POINTER(_KvMetrics)]),
    "og_session_last_error": (c_char_p, [_P]),
    # tokenizer
    "og_tokenizer_from_model": (c_int, [_P, POINTER(_P)]),
    "og_tokenizer_from_file": (c_int, [c_char_p, c_char_p, POINTER(_P)]),
    "og_tokenizer_destroy": (None, [_P]),
    "og_tokenize": (c_int, [_P, c_char_p, c_size_t, c_uint, POINTER(POINTER(c_int32)), POINTER(c_int64)]),
    "og_detokenize": (c_int, [_P, POINTER(c_int32), c_int64, POINTER(c_void_p), POINTER(c_size_t)]),
    "og_tokenizer_vocab_size": (c_int32, [_P]),
    "og_tokenizer_token_id": (c_int32, [_P, c_char_p]),
    "og_tokenizer_token_text": (c_char_p, [_P, c_int32]),
    "og_token_piece": (c_int, [_P, c_int32, POINTER(c_void_p), POINTER(c_size_t)]),
    "og_tokenizer_is_special": (c_int, [_P, c_int32]),
    "og_tokenizer_bos": (c_int32, [_P]),
    "og_tokenizer_eos": (c_int32, [_P]),
    "og_tokenizer_eot": (c_int32, [_P]),
    "og_tokenizer_stop_ids": (c_int32, [_P, POINTER(c_int32), c_int32]),
    "og_decode_stream_create": (c_int, [_P, POINTER(_P)]),
    "og_decode_stream_destroy": (None, [_P]),
    "og_decode_stream_push": (c_int, [_P, c_int32, POINTER(c_void_p), POINTER(c_size_t)]),
    "og_decode_stream_finish": (c_int, [_P, POINTER(c_void_p), POINTER(c_size_t)]),
    # tool calls
    "og_tokenizer_tool_format": (c_int, [_P]),
    "og_tool_format_name": (c_char_p, [c_int]),
    "og_tool_parser_create": (c_int, [c_int, POINTER(_P)]),
    "og_tool_parser_destroy": (None, [_P]),
    "og_tool_parser_feed": (c_int, [_P, c_char_p, c_size_t]),
    "og_tool_parser_finish": (c_int, [_P]),
    "og_tool_parser_take": (None, [_P, POINTER(c_void_p), POINTER(c_size_t), POINTER(POINTER(_ToolCall)),
                                   POINTER(c_int)]),
    "og_tool_parser_total_calls": (c_int, [_P]),
    "og_tool_parser_take_pieces": (c_int, [_P, POINTER(POINTER(_ToolPiece)), POINTER(c_int)]),
    "og_tool_calls_grammar_text": (c_int, [c_int, c_char_p, c_char_p, c_bool, POINTER(c_void_p)]),
    "og_tool_call_id": (c_int, [c_int, c_char_p, c_char_p, c_size_t]),
    # the engine
    "og_engine_default_params": (_EngineParams, []),
    "og_engine_create": (c_int, [_P, _P, POINTER(_EngineParams), POINTER(_P)]),
    "og_engine_destroy": (None, [_P]),
    "og_request_default_params": (_RequestParams, []),
    "og_engine_submit": (c_int, [_P, POINTER(_RequestParams), POINTER(_P)]),
    "og_engine_render": (c_int, [_P, POINTER(_RequestParams), POINTER(c_void_p)]),
    "og_request_next": (c_int, [_P, POINTER(_RequestOutput), c_double]),
    "og_request_cancel": (None, [_P]),
    "og_request_destroy": (None, [_P]),
}

_lib_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    """(what, name or path) pairs to try, in order."""
    soname = "liboffgraph.so.%d" % ABI_MAJOR
    here = os.path.dirname(os.path.abspath(__file__))
    out = [("next to the package", os.path.join(here, soname)),
           ("next to the package", os.path.join(here, "liboffgraph.so")),
           ("the dynamic loader", soname)]
    found = ctypes.util.find_library("offgraph")
    if found and found != soname:
        out.append(("ctypes.util.find_library", found))
    out.append(("make install's default prefix", os.path.join("/usr/local/lib", soname)))
    return out


def _open():
    env = os.environ.get("OFFGRAPH_LIB")
    if env:
        try:
            return ctypes.CDLL(env), env
        except OSError as e:
            raise OffgraphError("OFFGRAPH_LIB=%s cannot be loaded: %s" % (env, e)) from None
    tried = []
    for what, name in _candidates():
        if os.sep in name and not os.path.exists(name):
            tried.append("%s (%s): no such file" % (name, what))
            continue
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            tried.append("%s (%s): %s" % (name, what, e))
    raise OffgraphError("liboffgraph.so.%d was not found; set OFFGRAPH_LIB to its path, or install it "
                        "(make install, then ldconfig). Tried: %s" % (ABI_MAJOR, "; ".join(tried)))


def _L():
    """The loaded library, with every prototype declared (loaded on first use)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is None:
            lib, path = _open()
            for name, (restype, argtypes) in _PROTOTYPES.items():
                try:
                    fn = getattr(lib, name)
                except AttributeError:
                    raise OffgraphError("%s has no symbol %s: a library older than these bindings" %
                                        (path, name)) from None
                fn.restype = restype
                fn.argtypes = argtypes
            _lib_path = path
            _lib = lib
    return _lib


def library_path():
    """The path or name the shared library was loaded from (loads it)."""
    _L()
    return _lib_path


_LOG_LEVELS = {"debug": 0, "info": 1, "warn": 2, "error": 3, "none": 4}


def set_log_level(level):
    """Which of the library's messages go to standard error: "debug",
    "info", "warn" (the default), "error" or "none"."""
    if level not in _LOG_LEVELS:
        raise OffgraphError("log level must be one of %s, not %r" % (", ".join(_LOG_LEVELS), level))
    _L().og_log_set_level(_LOG_LEVELS[level])


def _status_name(code):
    return _STATUS_NAMES[code] if 0 <= code < len(_STATUS_NAMES) else "og_status %d" % code


def _text(b):
    return b.decode("utf-8", errors="replace") if b is not None else ""


def _check(st, what, message=None):
    """Raises OffgraphError for a status other than OG_OK. message: a
    function giving the library's message (default og_last_error)."""
    if st == 0:
        return
    msg = message() if message else _text(_L().og_last_error())
    name = _status_name(st)
    raise OffgraphError("%s: %s (%s)" % (what, msg or name, name), name, st)


def _path(p):
    return os.fsencode(p)


def _ids(tokens, what="tokens"):
    """tokens (an int or an iterable of ints) as a ctypes int32 array."""
    if isinstance(tokens, int):
        tokens = [tokens]
    try:
        seq = [int(t) for t in tokens]
    except (TypeError, ValueError):
        raise OffgraphError("%s must be token ids (ints), not %r" % (what, tokens)) from None
    for i, t in enumerate(seq):
        if not -2 ** 31 <= t < 2 ** 31:
            raise OffgraphError("%s[%d] = %d is not a 32-bit token id" % (what, i, t))
    return (c_int32 * len(seq))(*seq), len(seq)


def _floats(n):
    """A zeroed array.array('f') of n floats and a pointer to its buffer."""
    buf = array.array("f", bytes(4 * n))
    return buf, ctypes.cast(buf.buffer_info()[0], POINTER(c_float))


def _take_string(ptr, length):
    """The bytes of a string the library gave (og_free'd here)."""
    try:
        return ctypes.string_at(ptr.value, length.value) if ptr.value else b""
    finally:
        _L().og_free(ptr)


class _Handle:
    """An owned pointer to a library object, freed once."""

    _free = None  # name of the library function that frees it

    def __init__(self):
        self._h = None

    def _ptr(self):
        if self._h is None:
            raise OffgraphError("%s is closed" % type(self).__name__)
        return self._h

    @property
    def closed(self):
        return self._h is None

    def close(self):
        h, self._h = self._h, None
        if h is not None and _lib is not None:
            getattr(_lib, self._free)(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# -------------------------------------------------------------- sampling

class Sampler(_Handle):
    """Picks tokens from logits (og_sampler): forbidden tokens out, the
    repetition penalty, then greedy (temperature <= 0) or top-k, softmax at
    the temperature, top-p, min-p and a draw. The same seed, parameters and
    logits give the same tokens. Defaults are the library's (temperature 0.8,
    top_k 40, top_p 0.95, min_p 0.05, no repetition penalty); seed None
    draws one from os.urandom."""

    _free = "og_sampler_destroy"

    def __init__(self, vocab_size, temperature=None, top_k=None, top_p=None, min_p=None, repeat_penalty=None,
                 repeat_last_n=None, seed=None):
        super().__init__()
        L = _L()
        p = L.og_sampler_default_params()
        for name, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("min_p", min_p),
                        ("repeat_penalty", repeat_penalty), ("repeat_last_n", repeat_last_n)):
            if v is not None:
                setattr(p, name, v)
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        if not 0 <= int(seed) < 2 ** 64:
            raise OffgraphError("seed %d is outside [0, 2^64)" % seed)
        p.seed = int(seed)
        self.vocab_size = int(vocab_size)
        h = c_void_p()
        _check(L.og_sampler_create(byref(p), self.vocab_size, byref(h)), "sampler")
        self._h = h.value
        self.params = {f: getattr(p, f) for f, _ in _SamplerParams._fields_}

    def accept(self, token):
        """Adds a token to the history the repetition penalty looks at."""
        _L().og_sampler_accept(self._ptr(), int(token))

    def forbid(self, token):
        """Rules a token out for good."""
        _check(_L().og_sampler_forbid(self._ptr(), int(token)), "forbid %d" % token)

    def reset(self):
        """Forgets the history and reseeds (forbidden tokens stay)."""
        _L().og_sampler_reset(self._ptr())

    def sample(self, logits):
        """The next token from one row of vocab_size logits (any buffer of
        float32, e.g. what Session.eval returns, or a sequence of floats)."""
        if isinstance(logits, array.array) and logits.typecode == "f":
            row = logits
        else:
            row = array.array("f", logits)
        if len(row) != self.vocab_size:
            raise OffgraphError("sample: %d logits for a vocabulary of %d" % (len(row), self.vocab_size))
        return _L().og_sampler_sample(self._ptr(), ctypes.cast(row.buffer_info()[0], POINTER(c_float)))


# -------------------------------------------------------------- tokenizer

class DecodeStream(_Handle):
    """Text of tokens generated one at a time: push(id) gives the text that
    token completes (bytes of an incomplete UTF-8 character wait for the
    next tokens), finish() what is held back. Belongs to one thread at a
    time; its tokenizer must stay open."""

    _free = "og_decode_stream_destroy"

    def __init__(self, tokenizer):
        super().__init__()
        h = c_void_p()
        _check(_L().og_decode_stream_create(tokenizer._ptr(), byref(h)), "decode stream")
        self._h = h.value
        self.tokenizer = tokenizer
        tokenizer._streams.add(self)

    def push(self, token):
        text, n = c_void_p(), c_size_t()
        _check(_L().og_decode_stream_push(self._ptr(), int(token), byref(text), byref(n)),
               "decode stream push %d" % token)
        return _text(ctypes.string_at(text.value, n.value)) if n.value else ""

    def finish(self):
        text, n = c_void_p(), c_size_t()
        _check(_L().og_decode_stream_finish(self._ptr(), byref(text), byref(n)), "decode stream finish")
        return _text(ctypes.string_at(text.value, n.value)) if n.value else ""


class Tokenizer(_Handle):
    """Text <-> token ids as Hugging Face tokenizers does it (og_tokenizer).
    Model.tokenizer is the model's own; Tokenizer.from_files reads a
    tokenizer.json (and optionally a tokenizer_config.json)."""

    _free = "og_tokenizer_destroy"

    def __init__(self, _handle):
        super().__init__()
        self._h = _handle
        self._streams = weakref.WeakSet()

    @classmethod
    def from_files(cls, tokenizer_json, tokenizer_config=None):
        h = c_void_p()
        _check(_L().og_tokenizer_from_file(_path(tokenizer_json),
                                           _path(tokenizer_config) if tokenizer_config is not None else None,
                                           byref(h)), "tokenizer %s" % tokenizer_json)
        return cls(h.value)

    def close(self):
        for s in list(self._streams):
            s.close()
        super().close()

    def encode(self, text, add_special=True, parse_special=True):
        """Token ids of text (str, or bytes of UTF-8). add_special: the
        special tokens a model is fed around a text (e.g. a BOS), by the
        library's one rule (og_tokenize: tokenizer.json's post-processor, as
        transformers 5's tokenizer(text));
        parse_special: special tokens written in the text become their ids.
        Both True is Hugging Face's encode(text)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        flags = (_ADD_SPECIAL if add_special else 0) | (_PARSE_SPECIAL if parse_special else 0)
        ids, n = POINTER(c_int32)(), c_int64()
        _check(_L().og_tokenize(self._ptr(), data, len(data), flags, byref(ids), byref(n)), "encode")
        try:
            return ids[:n.value] if n.value else []
        finally:
            _L().og_free(ids)

    def decode_bytes(self, ids):
        arr, n = _ids(ids, "ids")
        text, length = c_void_p(), c_size_t()
        _check(_L().og_detokenize(self._ptr(), arr, n, byref(text), byref(length)), "decode")
        return _take_string(text, length)

    def decode(self, ids):
        """The text of ids, special tokens kept, as Hugging Face's decode(ids)."""
        return _text(self.decode_bytes(ids))

    def decode_stream(self):
        return DecodeStream(self)

    @property
    def vocab_size(self):
        """One past the largest token id."""
        return _L().og_tokenizer_vocab_size(self._ptr())

    def token_to_id(self, piece):
        """The id whose stored piece is exactly `piece` (e.g. "<|endoftext|>",
        or "\u0120the" of a byte-level vocabulary), or None."""
        i = _L().og_tokenizer_token_id(self._ptr(), piece.encode("utf-8") if isinstance(piece, str) else piece)
        return i if i >= 0 else None

    def id_to_token(self, token):
        """The stored piece of a token ("\u0120the"), or None for an id that is no token."""
        s = _L().og_tokenizer_token_text(self._ptr(), int(token))
        return _text(s) if s is not None else None

    def piece(self, token):
        """The text of the token decoded on its own (" the")."""
        text, length = c_void_p(), c_size_t()
        _check(_L().og_token_piece(self._ptr(), int(token), byref(text), byref(length)), "piece")
        return _text(_take_string(text, length))

    def is_special(self, token):
        return bool(_L().og_tokenizer_is_special(self._ptr(), int(token)))

    def _special(self, fn):
        i = fn(self._ptr())
        return i if i >= 0 else None

    @property
    def bos_id(self):
        return self._special(_L().og_tokenizer_bos)

    @property
    def eos_id(self):
        return self._special(_L().og_tokenizer_eos)

    @property
    def eot_id(self):
        """The token that ends an assistant's turn in the chat format, or None."""
        return self._special(_L().og_tokenizer_eot)

    @property
    def tool_format(self):
        """How the chat template has its model write tool calls
        (og_tokenizer_tool_format): "hermes", "mistral" or "llama3" (formats
        ToolParser takes calls out of), "other" (the template reads tools
        but its calls are not parsed) or "none" (it does not read tools)."""
        return _text(_L().og_tool_format_name(_L().og_tokenizer_tool_format(self._ptr())))

    @property
    def stop_ids(self):
        """The ids that end a generation (og_tokenizer_stop_ids: eos and end
        of turn), as every front end stops on them."""
        buf = (c_int32 * 8)()
        n = _L().og_tokenizer_stop_ids(self._ptr(), buf, 8)
        return [buf[i] for i in range(min(n, 8))]


# ------------------------------------------------------------- tool calls

def _tool_format(fmt):
    if fmt not in _TOOL_FORMATS:
        raise OffgraphError("tool format must be one of %s, not %r" % (", ".join(_TOOL_FORMATS), fmt))
    return _TOOL_FORMATS[fmt]


class ToolParser(_Handle):
    """Takes tool calls out of a model's output (og_tool_parser), in a
    format Tokenizer.tool_format names: feed(text) the output piece by piece
    (any split) and finish() at its end; each gives back (content, calls),
    what is ready since the previous call: the text outside the calls and
    the calls completed, as (name, arguments) pairs (arguments: JSON text).
    A format other than "hermes", "mistral" and "llama3" passes the text
    through as content. For a stream, feed_pieces(text) and
    finish_pieces() give the same output in the order it was written, the
    calls' arguments as they arrive (og_tool_parser_take_pieces): a list of
    (index, name, text, last), index None for content, else the call's
    index in the reply, name the call's name on its first piece (else
    None), text content or bytes of the call's arguments, last True on the
    call's last piece; a call's pieces' texts joined are its arguments as
    feed/finish give them. A parser is read one way or the other."""

    _free = "og_tool_parser_destroy"

    def __init__(self, tool_format):
        super().__init__()
        self.tool_format = tool_format
        h = c_void_p()
        _check(_L().og_tool_parser_create(_tool_format(tool_format), byref(h)), "tool parser")
        self._h = h.value

    def _take(self):
        content, n, calls, k = c_void_p(), c_size_t(), POINTER(_ToolCall)(), c_int()
        _L().og_tool_parser_take(self._ptr(), byref(content), byref(n), byref(calls), byref(k))
        text = ctypes.string_at(content.value, n.value).decode("utf-8", "replace") if n.value else ""
        return text, [(_text(calls[i].name), _text(calls[i].arguments)) for i in range(k.value)]

    def _feed(self, text):
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        _check(_L().og_tool_parser_feed(self._ptr(), data, len(data)), "tool parser feed")

    def feed(self, text):
        self._feed(text)
        return self._take()

    def finish(self):
        _check(_L().og_tool_parser_finish(self._ptr()), "tool parser finish")
        return self._take()

    def _take_pieces(self):
        pieces, k = POINTER(_ToolPiece)(), c_int()
        _check(_L().og_tool_parser_take_pieces(self._ptr(), byref(pieces), byref(k)), "tool parser take")
        res = []
        for i in range(k.value):
            p = pieces[i]
            text = ctypes.string_at(p.text, p.n).decode("utf-8", "replace") if p.n else ""
            res.append((None if p.call < 0 else p.call, None if p.name is None else _text(p.name), text, bool(p.last)))
        return res

    def feed_pieces(self, text):
        self._feed(text)
        return self._take_pieces()

    def finish_pieces(self):
        _check(_L().og_tool_parser_finish(self._ptr()), "tool parser finish")
        return self._take_pieces()

    @property
    def total_calls(self):
        """The calls completed since the parser was made."""
        return _L().og_tool_parser_total_calls(self._ptr())


def tool_calls_grammar(tool_format, tools, only_name=None, parallel=True):
    """The GBNF grammar (og_tool_calls_grammar_text) of an output that is
    only tool calls in tool_format: one (or with parallel, one or more) call
    of the function named only_name, or of any of tools (OpenAI's tools: a
    list of {"type": "function", "function": {"name", "parameters"}}, or its
    JSON text), its arguments following the function's parameters schema."""
    js = tools if isinstance(tools, (str, bytes)) else json.dumps(tools)
    js = js.encode("utf-8") if isinstance(js, str) else js
    out = c_void_p()
    _check(_L().og_tool_calls_grammar_text(_tool_format(tool_format), js,
                                           None if only_name is None else only_name.encode("utf-8"),
                                           bool(parallel), byref(out)), "tool calls grammar")
    try:
        return ctypes.string_at(out.value).decode("utf-8")
    finally:
        _L().og_free(out)


def tool_call_id(tool_format, unique):
    """A call's id as tool_format's template takes it back (og_tool_call_id):
    unique itself, or Mistral's 9 letters and digits derived from it."""
    buf = ctypes.create_string_buffer(256)
    _check(_L().og_tool_call_id(_tool_format(tool_format), unique.encode("utf-8"), buf, len(buf)), "tool call id")
    return _text(buf.value)


# ----------------------------------------------------------------- models

def _chat_params(p, keep, messages, template_vars, add_generation_prompt, tools):
    """Fills og_request_params p with a chat (what p points to kept alive in
    keep): messages as og_chat_message entries, or as messages_json when one
    has more than a role and a content; tools as tools_json."""
    msgs = list(messages)
    full = any(isinstance(m, dict) and set(m) - {"role", "content"} for m in msgs)
    if tools is not None:
        tj = (tools if isinstance(tools, (str, bytes)) else json.dumps(tools))
        tj = tj.encode("utf-8") if isinstance(tj, str) else tj
        keep.append(tj)
        p.tools_json = tj
    if full:
        mj = json.dumps(msgs).encode("utf-8")
        keep.append(mj)
        p.messages_json = mj
    else:
        arr = (_ChatMessage * max(len(msgs), 1))()
        for i, m in enumerate(msgs):
            try:
                role, content = m["role"], m.get("content")
            except (TypeError, KeyError):
                raise OffgraphError("submit: message %d must be a dict with a role and a content, not %r"
                                    % (i, m)) from None
            if content is None:
                content = ""
            if not isinstance(role, str) or not isinstance(content, str):
                raise OffgraphError("submit: message %d: role and content must be strings" % i)
            rb, cb = role.encode("utf-8"), content.encode("utf-8")
            keep += [rb, cb]
            arr[i].role, arr[i].content = rb, cb
        keep.append(arr)
        p.messages = ctypes.cast(arr, c_void_p)
        p.n_messages = len(msgs)
    p.kind = _PROMPT_CHAT
    p.add_generation_prompt = bool(add_generation_prompt)
    if template_vars:
        tv = json.dumps(template_vars).encode("utf-8")
        keep.append(tv)
        p.template_vars_json = tv


class StepItem:
    """One session's part of Model.step: its tokens and what it gets back.
    output: "none", "logits" (the last token's row), "logits_all" (a row a
    token), "argmax", or "sample" (drawn by `sampler`)."""

    __slots__ = ("session", "tokens", "output", "sampler")

    def __init__(self, session, tokens, output="argmax", sampler=None):
        self.session = session
        self.tokens = tokens
        self.output = output
        self.sampler = sampler


class Model(_Handle):
    """A loaded program file (og_model). backend: "cpu", "cuda" or "auto"
    (CUDA when the library was built with it and a GPU is present).
    n_threads: CPU threads, 0 for every online CPU. tensor_parallel: the
    model cut into that many shards (1 to 8; the CPU runs them in one
    process). devices: the CUDA device ordinals to run on, one a shard
    (None: the current device)."""

    _free = "og_model_destroy"

    def __init__(self, path, backend="auto", n_threads=0, cuda_graphs=True, tensor_parallel=1, devices=None):
        super().__init__()
        if backend not in _BACKENDS:
            raise OffgraphError("backend must be one of %s, not %r" % (", ".join(sorted(_BACKENDS)), backend))
        L = _L()
        p = L.og_model_default_params()
        p.backend = _BACKENDS[backend]
        p.n_threads = int(n_threads)
        p.cuda_graphs = 1 if cuda_graphs else 0
        p.tensor_parallel = int(tensor_parallel)
        if devices is not None:
            devices = [int(d) for d in devices]
            if len(devices) > len(p.devices):
                raise OffgraphError("devices: at most %d, one a shard" % len(p.devices))
            p.n_devices = len(devices)
            for i, d in enumerate(devices):
                p.devices[i] = d
        h = c_void_p()
        _check(L.og_model_load(_path(path), byref(p), byref(h)), "load %s" % path)
        self._h = h.value
        self.path = path
        self._sessions = weakref.WeakSet()
        self._tokenizer = None
        self._unknown_ids = None
        self._engines = {}      # kv_dtype -> og_engine handle (Model.generate's)
        self._requests = set()  # the engine requests not yet destroyed
        self._engine_lock = threading.Lock()

    def close(self):
        """Ends what Model.generate runs, closes every live session of the
        model, its tokenizer, then the model."""
        L = _L() if self._h else None
        for r in list(self._requests):
            r.destroy()
        for h in self._engines.values():
            L.og_engine_destroy(h)
        self._engines = {}
        for s in list(self._sessions):
            s.close()
        if self._tokenizer is not None:
            self._tokenizer.close()
        super().close()

    @property
    def backend(self):
        """"cpu" or "cuda": where the model runs."""
        return _BACKEND_NAMES.get(_L().og_model_backend(self._ptr()), "unknown")

    @property
    def vocab_size(self):
        """Width of a logits row."""
        return _L().og_model_vocab_size(self._ptr())

    def _kv(self):
        return _L().og_model_kv_config(self._ptr()).contents

    def metrics(self):
        """Figures of the model's batched steps (og_model_metrics) as a dict:
        steps, rows, graph_captures, captures and replays per batch bucket
        (bucket b holds 2^b sessions; CUDA decode graphs), and the seconds
        those steps spent by phase (prepare, submit, wait, finish)."""
        m = _ModelMetrics()
        _check(_L().og_model_metrics_get(self._ptr(), byref(m)), "metrics")
        return {"steps": m.steps, "rows": m.rows, "graph_captures": m.graph_captures,
                "bucket_captures": list(m.bucket_captures), "bucket_replays": list(m.bucket_replays),
                "prepare_seconds": m.prepare_seconds, "submit_seconds": m.submit_seconds,
                "wait_seconds": m.wait_seconds, "finish_seconds": m.finish_seconds}

    @property
    def max_context(self):
        """The most tokens a session can hold (the KV manifest's max_capacity)."""
        return self._kv().max_capacity

    @property
    def max_write(self):
        """The most tokens one item of a batched step may carry."""
        return self._kv().max_write

    @property
    def kv_dtype(self):
        return _DTYPE_NAMES.get(self._kv().kv_dtype, "unknown")

    @property
    def tokenizer(self):
        """The tokenizer the program embeds (made on first use)."""
        if self._tokenizer is None or self._tokenizer.closed:
            h = c_void_p()
            _check(_L().og_tokenizer_from_model(self._ptr(), byref(h)), "tokenizer of %s" % self.path)
            self._tokenizer = Tokenizer(h.value)
        return self._tokenizer

    def session(self, kv_dtype=None):
        """A new session (one conversation). kv_dtype: None keeps the
        program's, "f32", "bf16", "int8" or "fp8" overrides it."""
        return Session(self, kv_dtype)

    def restore(self, path):
        """A new session holding what Session.save wrote to path."""
        h = c_void_p()
        _check(_L().og_session_restore(self._ptr(), _path(path), byref(h)), "restore %s" % path)
        return Session(self, _handle=h.value)

    def prompt_ids(self, text, add_special=True):
        """The ids a text prompt is fed as, as `offgraph run` and
        /v1/completions make them: Tokenizer.encode(text, add_special), the
        special tokens the library's rule adds (og_tokenize) around the
        text's tokens (special tokens written in it parsed)."""
        return self.tokenizer.encode(text, add_special=add_special)

    def sampler(self, **params):
        """A Sampler over this model's vocabulary, the ids the tokenizer does
        not know forbidden (as `offgraph run` does). params: see Sampler."""
        s = Sampler(self.vocab_size, **params)
        try:
            for i in self._unknown():
                s.forbid(i)
        except BaseException:
            s.close()
            raise
        return s

    def _unknown(self):
        if self._unknown_ids is None:
            tok = self.tokenizer
            fn, h = _L().og_tokenizer_token_text, tok._ptr()
            self._unknown_ids = [i for i in range(self.vocab_size) if fn(h, i) is None]
        return self._unknown_ids

    def step(self, items):
        """Advances several sessions of this model in one batched step
        (og_model_step). items: StepItem objects or tuples (session, tokens
        [, output [, sampler]]); output as StepItem says, default "argmax".
        Returns one result per item: None ("none"), the token ("argmax",
        "sample"), an array.array('f') of vocab_size logits ("logits"), or a
        list of them, one a token ("logits_all"). The step is one
        transaction: on an error nothing changes in any session and
        OffgraphError names the item and the rule."""
        items = [it if isinstance(it, StepItem) else StepItem(*it) for it in items]
        if not items:
            raise OffgraphError("step: no items")
        L = _L()
        vocab = self.vocab_size
        c_items = (_BatchItem * len(items))()
        keep = []  # the token arrays and logits buffers, alive for the call
        outs = []
        for k, it in enumerate(items):
            if not isinstance(it.session, Session):
                raise OffgraphError("step: item %d: %r is not a Session" % (k, it.session))
            if it.session.model is not self:
                raise OffgraphError("step: item %d: its session is of another model" % k)
            if it.output not in _OUTPUTS:
                raise OffgraphError("step: item %d: output must be one of %s, not %r" %
                                    (k, ", ".join(_OUTPUTS), it.output))
            toks, n = _ids(it.tokens, "step: item %d: tokens" % k)
            ci = c_items[k]
            ci.session = it.session._ptr()
            ci.tokens = ctypes.cast(toks, POINTER(c_int32))
            ci.n_tokens = n
            ci.output = _OUTPUTS[it.output]
            buf = None
            if it.output in ("logits", "logits_all"):
                buf, ptr = _floats(vocab * (n if it.output == "logits_all" else 1))
                ci.logits = ptr
            if it.output == "sample":
                if not isinstance(it.sampler, Sampler):
                    raise OffgraphError("step: item %d: output \"sample\" needs a Sampler" % k)
                ci.sampler = it.sampler._ptr()
            keep.append(toks)
            outs.append(buf)
        _check(L.og_model_step(self._ptr(), c_items, len(items)), "step")
        results = []
        for k, it in enumerate(items):
            if it.output in ("argmax", "sample"):
                results.append(c_items[k].token)
            elif it.output == "logits":
                results.append(outs[k])
            elif it.output == "logits_all":
                results.append([outs[k][i * vocab:(i + 1) * vocab] for i in range(c_items[k].n_tokens)])
            else:
                results.append(None)
        return results

    def _engine(self, kv_dtype):
        """The library's engine (og_engine) over this model for sessions of
        kv_dtype, made on first use: the generation path `offgraph run` and
        the server take."""
        with self._engine_lock:
            h = self._engines.get(kv_dtype)
            if h is None:
                L = _L()
                p = L.og_engine_default_params()
                if kv_dtype is None:
                    p.session.kv_dtype = _DTYPE_KEEP
                elif kv_dtype in _DTYPES:
                    p.session.kv_dtype = _DTYPES[kv_dtype]
                else:
                    raise OffgraphError("kv_dtype must be None, \"f32\", \"bf16\", \"int8\" or \"fp8\", not %r"
                                        % (kv_dtype,))
                e = c_void_p()
                _check(L.og_engine_create(self._ptr(), self.tokenizer._ptr(), byref(p), byref(e)), "engine")
                h = self._engines[kv_dtype] = e.value
            return h

    def render_chat(self, messages, template_vars=None, add_generation_prompt=True, tools=None, kv_dtype=None):
        """The prompt text the engine renders for a chat (og_engine_render):
        messages, template_vars, add_generation_prompt and tools as submit
        takes them, through the model's chat template with the tokenizer's
        BOS and EOS texts, exactly what submit(messages=...) tokenizes;
        nothing is generated. A chat the template refuses raises
        OffgraphError with its message."""
        L = _L()
        p = L.og_request_default_params()
        keep = []
        _chat_params(p, keep, messages, template_vars, add_generation_prompt, tools)
        out = c_void_p()
        _check(L.og_engine_render(self._engine(kv_dtype), byref(p), byref(out)), "render")
        try:
            return ctypes.string_at(out.value).decode("utf-8") if out.value else ""
        finally:
            L.og_free(out)

    def submit(self, prompt=None, messages=None, max_tokens=0, temperature=0.8, top_k=40, top_p=0.95,
               min_p=0.05, repeat_penalty=1.0, repeat_last_n=64, seed=None, add_special=True, stop=None,
               logprobs=None, grammar=None, json_schema=None, template_vars=None, add_generation_prompt=True,
               ignore_eos=False, kv_dtype=None, session=None, tools=None):
        """Submits a request to the library's engine (og_engine_submit), the
        one generation path of every front end, and returns its Request
        (iterate it for its output). The prompt is one of: prompt, a str
        (tokenized by the tokenizer's rule: with add_special, the special
        tokens it adds, e.g. a BOS, as `offgraph run`) or a list of token ids
        (fed as given); or messages, a list of {"role", "content"} dicts
        rendered by the model's chat template (template_vars: a dict of extra
        template variables, e.g. {"enable_thinking": False}); a message with
        more than a role and a content (an assistant's tool_calls, their
        arguments as dicts, or a tool result's tool_call_id) goes to the
        template as it is, and tools (OpenAI's tools list) are shown to the
        template (og_request_params' messages_json and tools_json). temperature 0
        is greedy; top_k, top_p, min_p, repeat_penalty, repeat_last_n and
        seed are og_sampler_params' (seed None: one the engine picks). The
        engine ends the request after max_tokens tokens (0: where the context
        is full), at an end token of the tokenizer (unless ignore_eos), at a
        stop string (a str or a list of them; never in the text) or where the
        context is full. logprobs: None, or how many alternatives (0..20)
        each token's log-probability comes with. grammar (GBNF text) or
        json_schema (a dict or JSON text): what the output must follow.
        session: a Session of this model to go on in (the prompt is what
        comes after what it holds; every token generated is fed to it); it
        is the engine's until the request ends. kv_dtype: the KV dtype of
        the engine's sessions (as Model.session)."""
        L = _L()
        p = L.og_request_default_params()
        keep = []  # what p points to, alive until the submit has copied it
        if (prompt is None) == (messages is None):
            raise OffgraphError("submit: give a prompt or messages, not %s" % ("both" if prompt is not None else "neither"))
        if tools is not None and messages is None:
            raise OffgraphError("submit: tools need messages (a chat)")
        if messages is not None:
            _chat_params(p, keep, messages, template_vars, add_generation_prompt, tools)
        elif isinstance(prompt, (str, bytes)):
            text = prompt.encode("utf-8") if isinstance(prompt, str) else prompt
            keep.append(text)
            p.kind = _PROMPT_TEXT
            p.text = text
            p.add_special = bool(add_special)
        else:
            toks, n = _ids(prompt, "submit: prompt")
            keep.append(toks)
            p.kind = _PROMPT_TOKENS
            p.tokens = ctypes.cast(toks, POINTER(c_int32))
            p.n_tokens = n
        sp = p.sampling
        sp.temperature = float(temperature)
        sp.top_k = int(top_k)
        sp.top_p = float(top_p)
        sp.min_p = float(min_p)
        sp.repeat_penalty = float(repeat_penalty)
        sp.repeat_last_n = int(repeat_last_n)
        sp.seed = 0 if seed is None else int(seed) & 0xFFFFFFFFFFFFFFFF
        p.max_tokens = int(max_tokens)
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        if not all(isinstance(x, str) for x in stops):
            raise OffgraphError("submit: stop must be a string or a list of strings, not %r" % (stop,))
        if stops:
            arr = (c_char_p * len(stops))(*[x.encode("utf-8") for x in stops])
            keep.append(arr)
            p.stop = ctypes.cast(arr, POINTER(c_char_p))
            p.n_stop = len(stops)
        p.ignore_eos = bool(ignore_eos)
        p.logprobs = -1 if logprobs is None else int(logprobs)
        if grammar is not None:
            g = grammar.encode("utf-8") if isinstance(grammar, str) else bytes(grammar)
            keep.append(g)
            p.grammar = g
        if json_schema is not None:
            js = (json_schema if isinstance(json_schema, (str, bytes)) else json.dumps(json_schema))
            js = js.encode("utf-8") if isinstance(js, str) else js
            keep.append(js)
            p.json_schema = js
        if session is not None:
            if not isinstance(session, Session) or session.model is not self:
                raise OffgraphError("submit: session must be a Session of this model, not %r" % (session,))
            if session._request is not None:
                raise OffgraphError("submit: a request still runs on the session")
            p.session = session._ptr()
        e = self._engine(kv_dtype)
        h = c_void_p()
        _check(L.og_engine_submit(e, byref(p), byref(h)), "submit")
        return Request(self, h.value, session)

    def generate(self, prompt, max_tokens=128, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                 repeat_penalty=1.0, repeat_last_n=64, seed=None, add_special=True, stop=None, kv_dtype=None):
        """A generator of the text pieces of a continuation of prompt (a str,
        or a list of token ids), each given out as soon as it is complete:
        a request of the engine (Model.submit says what each argument does),
        as `offgraph run` generates. The finish reason ("stop" or "length")
        is the generator's return value. Closing the generator early cancels
        the generation. Threads may generate at once: the engine steps their
        requests together."""
        with self.submit(prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         min_p=min_p, repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed,
                         add_special=add_special, stop=stop, kv_dtype=kv_dtype) as req:
            for out in req:
                if out.text:
                    yield out.text
            return req.finish_reason


class Output:
    """What a request produced since the previous one (og_request_output):
    text (str: complete characters, never a stop string), tokens (ids, stop
    ids excluded), logprobs (when asked: one (token, logprob, [(token,
    logprob), ...]) a token)."""

    __slots__ = ("text", "tokens", "logprobs")

    def __init__(self, text, tokens, logprobs):
        self.text, self.tokens, self.logprobs = text, tokens, logprobs


_FINISH_NAMES = {_FINISH_STOP: "stop", _FINISH_LENGTH: "length", _FINISH_CANCELLED: "cancelled"}


class Request:
    """A request of the engine (og_request), made by Model.submit or
    Session.submit. Iterating it gives Output objects until it ends;
    finish_reason is then "stop", "length" or "cancelled" (a failure raises
    OffgraphError), and prompt_tokens, reused_tokens (from the prefix
    cache) and completion_tokens count its tokens. close() (or leaving a
    `with` block) cancels it if it still runs and frees it; with a session,
    it returns once the engine has let go of the session. One thread at a
    time."""

    def __init__(self, model, h, session=None):
        self.model, self._h, self.session = model, h, session
        self.finish_reason = None
        self.prompt_tokens = self.reused_tokens = self.completion_tokens = 0
        model._requests.add(self)
        if session is not None:
            session._request = self

    def __iter__(self):
        L = _L()
        out = _RequestOutput()
        while self._h is not None and self.finish_reason is None:
            # what has come, without waiting; when nothing has, a
            # millisecond's sleep: text in runs of tokens rather than a wake
            # of this thread at every one (as `offgraph run`)
            L.og_request_next(self._h, byref(out), 0.0)
            if not out.n_text and not out.n_tokens and out.finish == _FINISH_NONE:
                time.sleep(0.001)
                continue
            self.prompt_tokens, self.reused_tokens = out.prompt_tokens, out.reused_tokens
            self.completion_tokens = out.completion_tokens
            if out.finish == _FINISH_ERROR:
                self.finish_reason = "error"
                raise OffgraphError("generate: %s" % _text(out.error), status=_status_name(out.status))
            if out.n_text or out.n_tokens:
                text = ctypes.string_at(out.text, out.n_text).decode("utf-8", "replace") if out.n_text else ""
                tokens = out.tokens[:out.n_tokens] if out.n_tokens else []
                lps = None
                if out.n_logprobs:
                    arr = ctypes.cast(out.logprobs, POINTER(_TokenLogprob))
                    lps = [(arr[i].token, arr[i].logprob,
                            [(arr[i].top[k], arr[i].top_logprob[k]) for k in range(arr[i].n_top)])
                           for i in range(out.n_logprobs)]
                yield Output(text, tokens, lps)
            if out.finish != _FINISH_NONE:
                self.finish_reason = _FINISH_NAMES.get(out.finish, "stop")
        if self.finish_reason is not None and self.session is not None:
            self._release()

    def _release(self):
        if self.session is not None and self.session._request is self:
            self.session._request = None

    def cancel(self):
        """Asks the request to end at the engine's next step (any thread)."""
        if self._h is not None:
            _L().og_request_cancel(self._h)

    def close(self):
        h, self._h = self._h, None
        if h is not None:
            _L().og_request_destroy(h)
            self.model._requests.discard(self)
        self._release()

    destroy = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Session(_Handle):
    """One conversation of a model: its own KV storage. Sessions are closed
    before their model (Model.close does it)."""

    _free = "og_session_destroy"

    def __init__(self, model, kv_dtype=None, _handle=None):
        super().__init__()
        self.model = model
        self.last_finish_reason = None
        if _handle is None:
            L = _L()
            p = L.og_session_default_params()
            if kv_dtype is None:
                p.kv_dtype = _DTYPE_KEEP
            elif kv_dtype in _DTYPES:
                p.kv_dtype = _DTYPES[kv_dtype]
            else:
                raise OffgraphError("kv_dtype must be None, \"f32\", \"bf16\", \"int8\" or \"fp8\", not %r"
                                    % (kv_dtype,))
            h = c_void_p()
            _check(L.og_session_create(model._ptr(), byref(p), byref(h)), "session")
            _handle = h.value
        self._h = _handle
        self._request = None  # the engine's request running on it (Session.submit)
        model._sessions.add(self)

    def _ptr(self):
        if self._request is not None:
            raise OffgraphError("the session is the engine's until its request (Session.submit) ends")
        return super()._ptr()

    def close(self):
        """Ends the request running on it, if any, then frees it."""
        if self._request is not None:
            self._request.close()
        super().close()

    def _error(self):
        return _text(_L().og_session_last_error(self._h)) if self._h else _text(_L().og_last_error())

    def _check(self, st, what):
        _check(st, what, self._error)

    @property
    def length(self):
        """Tokens the session holds."""
        return _L().og_session_length(self._ptr())

    def __len__(self):
        return self.length

    def reset(self):
        """Forgets the conversation (length 0), keeping storage."""
        _L().og_session_reset(self._ptr())

    def eval(self, tokens, logits="last", chunk=0):
        """Feeds tokens (split in steps of at most chunk tokens; 0: as the
        executor splits them). logits: "last" returns the last position's
        row (array.array('f') of vocab_size; numpy.frombuffer(row,
        dtype=numpy.float32) views it without a copy), "all" a list of rows,
        one a token, None nothing."""
        toks, n = _ids(tokens)
        if n == 0:
            raise OffgraphError("eval: no tokens")
        vocab = self.model.vocab_size
        if logits is None:
            self._check(_L().og_session_eval(self._ptr(), toks, n, int(chunk), None, 0), "eval")
            return None
        if logits not in ("last", "all"):
            raise OffgraphError("eval: logits must be \"last\", \"all\" or None, not %r" % (logits,))
        rows = n if logits == "all" else 1
        buf, ptr = _floats(rows * vocab)
        self._check(_L().og_session_eval(self._ptr(), toks, n, int(chunk), ptr, 1 if logits == "all" else 0),
                    "eval")
        if logits == "last":
            return buf
        return [buf[i * vocab:(i + 1) * vocab] for i in range(n)]

    def eval_next(self, tokens, chunk=0):
        """Feeds tokens and returns the arg-max token of the last position."""
        toks, n = _ids(tokens)
        out = c_int32()
        self._check(_L().og_session_eval_next(self._ptr(), toks, n, int(chunk), byref(out)), "eval_next")
        return out.value

    def eval_sample(self, tokens, sampler, chunk=0):
        """Feeds tokens and returns a token drawn by sampler from the last position's logits."""
        if not isinstance(sampler, Sampler):
            raise OffgraphError("eval_sample: %r is not a Sampler" % (sampler,))
        toks, n = _ids(tokens)
        out = c_int32()
        self._check(_L().og_session_eval_sample(self._ptr(), toks, n, int(chunk), sampler._ptr(), byref(out)),
                    "eval_sample")
        return out.value

    def fork(self, at_length=None):
        """A new session holding this one's first at_length tokens (default:
        all), that goes its own way from there (rows below are shared, not
        copied, where the storage allows)."""
        at = self.length if at_length is None else int(at_length)
        h = c_void_p()
        self._check(_L().og_session_fork(self._ptr(), at, byref(h)), "fork at %d" % at)
        return Session(self.model, _handle=h.value)

    def save(self, path):
        """Writes the session's KV rows to path (crash-safe: a temp file renamed over it)."""
        self._check(_L().og_session_save(self._ptr(), _path(path)), "save %s" % path)

    def restore(self, path):
        """Replaces this session's conversation with what path holds."""
        self._check(_L().og_session_restore_into(self._ptr(), _path(path)), "restore %s" % path)

    def metrics(self):
        """KV figures (og_kv_metrics) as a dict."""
        m = _KvMetrics()
        self._check(_L().og_session_metrics(self._ptr(), byref(m)), "metrics")
        return {f: getattr(m, f) for f, _ in _KvMetrics._fields_}

    def submit(self, prompt=None, messages=None, **kw):
        """A request of the engine that goes on in this session: the prompt
        (text, token ids, or chat messages: what comes after what the
        session holds) is fed after it, and every generated token too, so
        that once the request has ended the session holds what it held, the
        prompt and the generated tokens (end tokens excluded). Until then
        the session is the engine's (its other methods must wait). Arguments
        as Model.submit."""
        return self.model.submit(prompt, messages, session=self, **kw)

    def generate_tokens(self, prompt, max_tokens=128, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                        repeat_penalty=1.0, repeat_last_n=64, seed=None, add_special=True, stop=None):
        """A generator of the token ids of a continuation of prompt (a str,
        tokenized by the tokenizer's rule, e.g. with a BOS, as `offgraph run`;
        or a list of token ids fed as they are) after what the session holds:
        Session.submit's request (Model.submit says what each argument
        does). The finish reason ("stop" or "length") is the generator's
        return value and last_finish_reason; the session then holds the
        prompt and every token given out."""
        with self.submit(prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         min_p=min_p, repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed,
                         add_special=add_special, stop=stop) as req:
            self.last_finish_reason = None
            for out in req:
                for t in out.tokens:
                    yield t
            self.last_finish_reason = req.finish_reason
            return req.finish_reason

    def generate(self, prompt, max_tokens=128, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                 repeat_penalty=1.0, repeat_last_n=64, seed=None, add_special=True, stop=None):
        """A generator of the text pieces of generate_tokens(prompt, ...),
        each given out as soon as its characters are complete; stop strings
        (a str or a list) end the text before them, as `offgraph run --stop`.
        The return value is the finish reason ("stop" or "length"), also in
        last_finish_reason."""
        with self.submit(prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         min_p=min_p, repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed,
                         add_special=add_special, stop=stop) as req:
            self.last_finish_reason = None
            for out in req:
                if out.text:
                    yield out.text
            self.last_finish_reason = req.finish_reason
            return req.finish_reason


from .llama import Llama  # noqa: E402  (it builds on the classes above)

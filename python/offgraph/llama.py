"""A Llama-style API over the library's engine, for code written against
llama.cpp's Python habits:

    from offgraph import Llama
    llm = Llama(model_path="build/kjv-tiny.ogp", n_gpu_layers=0)
    out = llm.create_completion("In the beginning", max_tokens=16, temperature=0)
    print(out["choices"][0]["text"])
    chat = llm.create_chat_completion([{"role": "user", "content": "Hello"}],
                                      response_format={"type": "json_object"})
    calls = llm.create_chat_completion(messages, tools=tools, tool_choice="required")

Every call is one request of the engine (Model.submit): the prompt's special
tokens, the chat template, stop ids and strings, the sampler and the grammar
of response_format, the tool-call format of the template, its parser and the
grammar of required calls are the library's, exactly as `offgraph run` and
`offgraph serve` apply them; this module only turns arguments into a request and the
request's output into OpenAI-shaped dicts (or, with stream=True, an iterator
of chunks). What the engine does not do is refused with OffgraphError naming
the argument, never ignored.
"""

import json
import re
import time
import uuid

from . import Model, OffgraphError, ToolParser, set_log_level, tool_call_id, tool_calls_grammar

_CHOICE_HELP = 'none, auto, required or {"type": "function", "function": {"name": ...}}'
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name


def _tool_choice(tools, tool_choice):
    """(mode, only_name) of tools / tool_choice: mode "none", "auto",
    "required" or "named"; tools checked to be OpenAI's function tools."""
    only = None
    if tool_choice is None:
        mode = "auto" if tools else "none"
    elif isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise OffgraphError("tool_choice must be %s, not %r" % (_CHOICE_HELP, tool_choice))
        mode = tool_choice
    else:
        fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
        if (tool_choice.get("type") if isinstance(tool_choice, dict) else None) != "function" or \
                not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise OffgraphError("tool_choice must be %s, not %r" % (_CHOICE_HELP, tool_choice))
        mode, only = "named", fn["name"]
    if tools is None:
        if mode != "none":
            raise OffgraphError("tool_choice %s needs tools" % ("naming a function" if only else mode))
        return mode, None
    if not isinstance(tools, (list, tuple)) or not tools:
        raise OffgraphError('tools must be a non-empty list of {"type": "function", "function": {...}}')
    names = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise OffgraphError('tools[%d] must be {"type": "function", "function": {"name", "description", '
                                '"parameters"}}, not %r' % (i, t))
        if not isinstance(fn.get("name"), str) or not _NAME.match(fn["name"]):
            raise OffgraphError("tools[%d].function.name must be 1 to 64 letters, digits, '_' or '-', not %r"
                                % (i, fn.get("name")))
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise OffgraphError("tools[%d].function.description must be a string" % i)
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise OffgraphError("tools[%d].function.parameters must be a JSON schema (a dict)" % i)
        names.append(fn["name"])
    if only is not None and only not in names:
        raise OffgraphError("tool_choice names %r, which is not in tools" % only)
    return mode, only


def _message(m, i):
    """A message as the chat template reads it: content as text; an
    assistant's tool_calls with each call's arguments as a dict (OpenAI
    sends JSON text, templates read a mapping); a tool result's
    tool_call_id (and name)."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise OffgraphError("messages[%d] must be a dict with a role, not %r" % (i, m))
    role = "system" if m["role"] == "developer" else m["role"]
    out = {"role": role, "content": _content(m, i)}
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str):
            raise OffgraphError("messages[%d]: a 'tool' message needs a string tool_call_id" % i)
        out["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            out["name"] = m["name"]
        return out
    calls = m.get("tool_calls")
    if calls is None:
        return out
    if role != "assistant":
        raise OffgraphError("messages[%d]: only an assistant message has tool_calls" % i)
    if not isinstance(calls, (list, tuple)):
        raise OffgraphError("messages[%d].tool_calls must be a list" % i)
    if not calls:
        return out
    out["tool_calls"] = []
    for k, c in enumerate(calls):
        where = "messages[%d].tool_calls[%d]" % (i, k)
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or c.get("type", "function") != "function":
            raise OffgraphError('%s must be {"id", "type": "function", "function": {"name", "arguments"}}' % where)
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = None
        elif args is None:
            args = {}
        if not isinstance(args, dict):
            raise OffgraphError("%s.function.arguments must be a JSON object (as a string)" % where)
        call = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if c.get("id") is not None:
            if not isinstance(c["id"], str):
                raise OffgraphError("%s.id must be a string" % where)
            call["id"] = c["id"]
        out["tool_calls"].append(call)
    return out


def _schema_of(response_format):
    """(json_schema, None) for a response_format; None for free text."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise OffgraphError("response_format must be a dict with a type (text, json_object, json_schema), not %r"
                            % (response_format,))
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        # llama.cpp's Python binding takes a schema here too
        return response_format.get("schema") or {"type": "object"}
    if kind == "json_schema":
        js = response_format.get("json_schema")
        schema = js.get("schema") if isinstance(js, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise OffgraphError("response_format.json_schema.schema must be a JSON schema (a dict)")
        return schema
    raise OffgraphError("response_format.type must be text, json_object or json_schema, not %r" % kind)


def _content(message, i):
    """A message's text: a str, or a list of {"type": "text", "text"} parts."""
    c = message.get("content")
    if c is None or isinstance(c, str):
        return c or ""
    if isinstance(c, list):
        parts = []
        for p in c:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise OffgraphError("messages[%d].content: only text parts are supported, not %r" % (i, p))
            parts.append(p["text"])
        return "".join(parts)
    raise OffgraphError("messages[%d].content must be a string or a list of text parts" % i)


class Llama:
    """A model served by the library's engine, with llama.cpp's Python names.

    model_path: an exported program (`offgraph export`). n_gpu_layers: 0 runs
    on the CPU, any other number (-1: all) on CUDA, None (default) CUDA when
    the library has it and a GPU is present; offgraph runs a model whole on
    one back end, so the number only chooses it. n_threads: CPU threads (None
    or 0: every CPU). n_ctx: the context a request may use; offgraph's is the
    program's (chosen at export): 0 or None takes it, a larger n_ctx is
    refused, a smaller one is accepted and n_ctx() says what is used.
    seed: the seed of requests that give none (None: the engine picks one
    per request). verbose: the library's informational messages on stderr.
    kv_dtype: None keeps the program's KV dtype; "f32", "bf16", "int8",
    "fp8" override it. chat_template_kwargs: extra chat template variables
    for every chat (e.g. {"enable_thinking": False})."""

    def __init__(self, model_path, n_gpu_layers=None, n_threads=None, n_ctx=0, seed=None, verbose=False,
                 kv_dtype=None, chat_template_kwargs=None, **unsupported):
        if unsupported:
            raise OffgraphError("Llama: not supported: %s" % ", ".join(sorted(unsupported)))
        if verbose:
            set_log_level("info")
        backend = "auto" if n_gpu_layers is None else ("cpu" if int(n_gpu_layers) == 0 else "cuda")
        self.model_path = model_path
        self._model = Model(model_path, backend=backend, n_threads=int(n_threads or 0))
        ctx = self._model.max_context
        if n_ctx and int(n_ctx) > ctx:
            self._model.close()
            raise OffgraphError("n_ctx %d: the program %s holds at most %d tokens a session (chosen at export)"
                                % (int(n_ctx), model_path, ctx))
        self.seed = seed
        self.kv_dtype = kv_dtype
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    # -- what llama.cpp's Llama offers besides generation
    @property
    def model(self):
        """The offgraph.Model under it."""
        return self._model

    def close(self):
        self._model.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def n_ctx(self):
        return self._model.max_context

    def n_vocab(self):
        return self._model.vocab_size

    def token_bos(self):
        b = self._model.tokenizer.bos_id
        return -1 if b is None else b

    def token_eos(self):
        e = self._model.tokenizer.eos_id
        return -1 if e is None else e

    def tokenize(self, text, add_bos=True, special=False):
        """Token ids of text (bytes or str): add_bos adds the special tokens
        the tokenizer's rule adds (a BOS where it has one), special parses
        special tokens written in the text."""
        return self._model.tokenizer.encode(text, add_special=add_bos, parse_special=special)

    def detokenize(self, tokens):
        """The bytes of tokens."""
        return self._model.tokenizer.decode_bytes(tokens)

    # -- generation
    def _request(self, prompt, messages, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, seed, stop,
                 logprobs, grammar, response_format, template_vars=None, tools=None):
        schema = _schema_of(response_format)
        if grammar is not None and schema is not None:
            raise OffgraphError("grammar and response_format: give one")
        if grammar is not None and not isinstance(grammar, (str, bytes)):
            grammar = getattr(grammar, "text", None) or getattr(grammar, "_grammar", None)
            if not isinstance(grammar, (str, bytes)):
                raise OffgraphError("grammar must be GBNF text")
        if max_tokens is None or int(max_tokens) <= 0:
            max_tokens = 0  # until the context is full
        if seed is None:
            seed = self.seed
        return self._model.submit(prompt, messages, max_tokens=int(max_tokens), temperature=temperature,
                                  top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty, seed=seed,
                                  stop=stop, logprobs=logprobs, grammar=grammar, json_schema=schema,
                                  template_vars=template_vars, kv_dtype=self.kv_dtype, tools=tools)

    @staticmethod
    def _usage(req):
        return {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.completion_tokens,
                "total_tokens": req.prompt_tokens + req.completion_tokens}

    def _token_bytes(self, token):
        """The bytes of one token decoded alone; b"" for an id the tokenizer
        does not know (a padded vocabulary), as the server names them."""
        try:
            return self._model.tokenizer.decode_bytes([token])
        except OffgraphError:
            return b""

    def _piece(self, token):
        return self._token_bytes(token).decode("utf-8", "replace")

    def create_completion(self, prompt, suffix=None, max_tokens=16, temperature=0.8, top_p=0.95, min_p=0.05,
                          echo=False, stop=None, repeat_penalty=1.0, top_k=40, seed=None, stream=False,
                          logprobs=None, grammar=None, response_format=None):
        """A text completion of prompt (a str, tokenized by the tokenizer's
        rule, e.g. with a BOS, as `offgraph run`; or token ids): a dict shaped
        as OpenAI's text_completion, or with stream=True an iterator of its
        chunks. max_tokens None or <= 0: until the context is full. logprobs:
        how many alternatives (0..20) each token's log-probability comes
        with. grammar: GBNF text the output must follow; response_format:
        {"type": "json_object"} or {"type": "json_schema", "json_schema":
        {"schema": ...}}."""
        if suffix is not None:
            raise OffgraphError("suffix: not supported (offgraph has no fill-in-the-middle)")
        req = self._request(prompt, None, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, seed, stop,
                            logprobs, grammar, response_format)
        cid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        head = prompt if echo and isinstance(prompt, str) else (
            self._model.tokenizer.decode(prompt) if echo else "")
        if stream:
            return self._stream_completion(req, cid, created, head, logprobs is not None)
        with req:
            texts, lps, offset = [head], None, len(head)
            if logprobs is not None:
                lps = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
            for out in req:
                texts.append(out.text)
                if lps is not None:
                    offset = self._add_logprobs(lps, out, offset)
        return {"id": cid, "object": "text_completion", "created": created, "model": self.model_path,
                "choices": [{"text": "".join(texts), "index": 0, "logprobs": lps,
                             "finish_reason": req.finish_reason}],
                "usage": self._usage(req)}

    __call__ = create_completion

    def _add_logprobs(self, lps, out, offset):
        for token, lp, top in out.logprobs or ():
            piece = self._piece(token)
            lps["tokens"].append(piece)
            lps["text_offset"].append(offset)
            lps["token_logprobs"].append(lp)
            alts = {}
            for t, v in top:
                alts.setdefault(self._piece(t), v)  # the likelier of two alike
            lps["top_logprobs"].append(alts)
            offset += len(piece)
        return offset

    def _stream_completion(self, req, cid, created, head, want_lps):
        with req:
            offset = len(head)
            if head:
                yield self._completion_chunk(cid, created, head, None, None)
            for out in req:
                lps = None
                if want_lps:
                    lps = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
                    offset = self._add_logprobs(lps, out, offset)
                if out.text or lps:
                    yield self._completion_chunk(cid, created, out.text, lps, None)
            chunk = self._completion_chunk(cid, created, "", None, req.finish_reason)
            chunk["usage"] = self._usage(req)
            yield chunk

    def _completion_chunk(self, cid, created, text, lps, finish):
        return {"id": cid, "object": "text_completion", "created": created, "model": self.model_path,
                "choices": [{"text": text, "index": 0, "logprobs": lps, "finish_reason": finish}]}

    def _chat(self, messages, tools, tool_choice, chat_template_kwargs):
        """What create_chat_completion gives the template: (messages as the
        template reads them, tool mode, the named function, the tool format,
        the tools shown or None, the template variables or None)."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise OffgraphError("messages must be a non-empty list of {role, content} dicts")
        mode, only = _tool_choice(tools, tool_choice)
        msgs = [_message(m, i) for i, m in enumerate(messages)]
        fmt, shown = None, None
        if mode != "none":  # "none": the tools are not shown, the reply is text
            fmt = self._model.tokenizer.tool_format
            if fmt == "none":
                raise OffgraphError("tools: this model's chat template does not take tools")
            if fmt == "other":
                raise OffgraphError("tools: this model's chat template writes tool calls in a format offgraph does "
                                    "not parse (it parses Qwen's and Hermes' <tool_call>, Mistral's [TOOL_CALLS] "
                                    "and Llama 3.1's JSON)")
            shown = list(tools)
        tv = dict(self.chat_template_kwargs)
        tv.update(chat_template_kwargs or {})
        return msgs, mode, only, fmt, shown, tv or None

    def render_chat(self, messages, tools=None, tool_choice=None, chat_template_kwargs=None,
                    add_generation_prompt=True):
        """The prompt text create_chat_completion renders for these
        arguments (Model.render_chat, og_engine_render): the messages as
        OpenAI sends them (a call's arguments as JSON text), the tools shown
        unless tool_choice is "none", the template variables with the
        Llama's; a str, nothing generated. Refused as create_chat_completion
        refuses them."""
        msgs, _mode, _only, _fmt, shown, tv = self._chat(messages, tools, tool_choice, chat_template_kwargs)
        return self._model.render_chat(msgs, template_vars=tv, add_generation_prompt=add_generation_prompt,
                                       tools=shown, kv_dtype=self.kv_dtype)

    def create_chat_completion(self, messages, temperature=0.2, top_p=0.95, top_k=40, min_p=0.05, stream=False,
                               stop=None, seed=None, response_format=None, max_tokens=None, repeat_penalty=1.0,
                               logprobs=False, top_logprobs=None, grammar=None, tools=None, tool_choice=None,
                               chat_template_kwargs=None, parallel_tool_calls=None):
        """A reply to messages (a list of {"role", "content"} dicts; content
        a str or a list of text parts) through the model's chat template: a
        dict shaped as OpenAI's chat.completion, or with stream=True an
        iterator of chat.completion.chunk dicts. response_format and grammar
        as create_completion; logprobs and top_logprobs as OpenAI's;
        chat_template_kwargs: extra template variables (with the Llama's).
        tools: OpenAI's function tools, shown to the model by its chat
        template; tool_choice: "none" (the tools are not shown), "auto" (the
        default with tools), "required" (a call at least, enforced by a
        grammar) or {"type": "function", "function": {"name": ...}} (a call
        of that function); parallel_tool_calls False: required and named
        give one call, not one or more (as the server, it does not limit
        "auto"). The
        calls the model writes (in its template's format: Qwen's and Hermes'
        <tool_call>, Mistral's [TOOL_CALLS], Llama 3.1's JSON) come out as
        message.tool_calls ({"id", "type": "function", "function": {"name",
        "arguments": JSON text}}; streamed as OpenAI streams them: a first
        delta.tool_calls entry with the call's index, id, type, name and
        arguments "", then entries with its index and the arguments' bytes
        as the model writes them) and finish_reason "tool_calls"; messages may hold an
        assistant's tool_calls and "tool" results. A template that does not
        read tools, or writes calls in a format offgraph does not parse,
        refuses tools."""
        msgs, mode, only, fmt, shown, tv = self._chat(messages, tools, tool_choice, chat_template_kwargs)
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise OffgraphError("parallel_tool_calls must be a bool")
        if mode != "none":
            if mode in ("required", "named"):
                if grammar is not None or response_format is not None:
                    raise OffgraphError("tool_choice %s and %s cannot both constrain the reply"
                                        % ("naming a function" if only else mode,
                                           "grammar" if grammar is not None else "response_format"))
                grammar = tool_calls_grammar(fmt, shown, only, parallel_tool_calls is not False)
        n_top = None
        if logprobs:
            n_top = int(top_logprobs or 0)
        req = self._request(None, msgs, max_tokens, temperature, top_p, top_k, min_p, repeat_penalty, seed, stop,
                            n_top, grammar, response_format, tv, shown)
        cid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        parser = ToolParser(fmt) if fmt is not None else None
        if stream:
            return self._stream_chat(req, cid, created, n_top is not None, parser)
        with req:
            texts, content = [], [] if n_top is not None else None
            for out in req:
                texts.append(out.text)
                if content is not None:
                    content += self._chat_logprobs(out)
        message = {"role": "assistant", "content": "".join(texts)}
        finish = req.finish_reason
        if parser is not None:
            with parser:
                text, calls = parser.feed(message["content"])
                more, last = parser.finish()
            text, calls = text + more, calls + last
            message["content"] = None if calls and not text else text
            if calls:
                message["tool_calls"] = self._tool_calls(fmt, cid, calls)
                if finish == "stop":
                    finish = "tool_calls"
        return {"id": cid, "object": "chat.completion", "created": created, "model": self.model_path,
                "choices": [{"index": 0, "message": message,
                             "logprobs": None if content is None else {"content": content},
                             "finish_reason": finish}],
                "usage": self._usage(req)}

    @staticmethod
    def _tool_calls(fmt, cid, calls):
        """The calls as OpenAI gives them, ids unique to the response."""
        return [{"id": Llama._call_id(fmt, cid, i), "type": "function", "function": {"name": name, "arguments": args}}
                for i, (name, args) in enumerate(calls)]

    @staticmethod
    def _call_id(fmt, cid, index):
        """Call index's id, unique to the response cid, as the template
        takes it back (tool_call_id)."""
        return tool_call_id(fmt, "call_%s%d" % (cid[len("chatcmpl-"):][:24], index))

    def _chat_logprobs(self, out):
        def entry(token, lp):
            b = self._token_bytes(token)
            return {"token": b.decode("utf-8", "replace"), "logprob": lp, "bytes": list(b)}
        res = []
        for token, lp, top in out.logprobs or ():
            e = entry(token, lp)
            e["top_logprobs"] = [entry(t, v) for t, v in top]
            res.append(e)
        return res

    def _stream_chat(self, req, cid, created, want_lps, parser=None):
        def chunk(delta, finish, lps=None):
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": self.model_path,
                    "choices": [{"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish}]}

        def chunks(pieces, lps):
            """The parser's pieces as chunks, in order: content (with the
            take's logprobs), and each call as OpenAI streams it: a first
            delta with its index, id, type, name and arguments "", then
            deltas with its index and bytes of its arguments."""
            text = []
            for index, name, piece, _last in pieces:
                if index is None:
                    text.append(piece)
                    continue
                if text or lps:
                    yield chunk({"content": "".join(text)} if text else {}, None, lps)
                    text, lps = [], None
                if name is not None:
                    yield chunk({"tool_calls": [{"index": index, "id": self._call_id(parser.tool_format, cid, index),
                                                 "type": "function", "function": {"name": name, "arguments": ""}}]},
                                None)
                if piece:
                    yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, None)
            if text or lps:
                yield chunk({"content": "".join(text)} if text else {}, None, lps)
        with req:
            yield chunk({"role": "assistant"}, None)
            for out in req:
                lps = {"content": self._chat_logprobs(out)} if want_lps else None
                pieces = [(None, None, out.text, False)] if parser is None else parser.feed_pieces(out.text)
                yield from chunks(pieces, lps)
            finish = req.finish_reason
            if parser is not None:
                yield from chunks(parser.finish_pieces(), None)
                if parser.total_calls and finish == "stop":
                    finish = "tool_calls"
                parser.close()
            last = chunk({}, finish)
            last["usage"] = self._usage(req)
            yield last

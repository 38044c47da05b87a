"""Tool calls in the Llama-style API (offgraph.Llama.create_chat_completion
with tools / tool_choice), run by tests/cli_python_tools.sh:

    check_tools.py calls MODEL TEMPLATE PORT TOOLS_JSON CASES_JSON
        MODEL: the qwen3-mixed checkpoint exported with the chat template
        tests/data/chat_templates/TEMPLATE.jinja; PORT: `offgraph serve` of
        the same program (0: none). Checks
        - the prompt the template renders from OpenAI-shaped messages (calls
          with arguments as JSON text, tool results) and tools
          (Llama.render_chat, og_engine_render): the text of Hugging Face
          transformers' rendering committed in CASES_JSON
          (tests/data/chat_templates/tool_cases.json) byte for byte (and a
          request's prompt as many tokens as it), and the conversations
          transformers' template refuses refused;
        - tool_choice "required" and a named function: a call that validates
          against its function's parameters schema (python3-jsonschema),
          finish_reason "tool_calls", content None; streamed, the deltas
          give the same calls, each as OpenAI streams it (a first delta with
          its index, id, type, name and arguments "", then its arguments in
          more than one delta that join into the whole reply's arguments);
          the calls sent back with their results in a second turn;
        - the same requests (greedy and sampled with a seed, auto, required,
          named, streamed and not) give the server's content, calls and
          finish_reason.
    check_tools.py refusals QWEN3_MODEL DEMO_MODEL OTHER_MODEL TOOLS_JSON
        bad tools / tool_choice / messages are refused with OffgraphError
        naming what is wrong; the demo model's template takes no tools, and
        OTHER_MODEL's reads them but writes calls in no format offgraph
        parses: tools refused, tool_choice "none" and tool results taken.
"""
import json
import re
import sys
import urllib.error
import urllib.request

import jsonschema

import offgraph
from offgraph import Llama, OffgraphError

fails = 0


def check(cond, what):
    global fails
    if not cond:
        fails += 1
        print("FAIL: %s" % what)
    return cond


def raises(fn, pattern, what):
    try:
        fn()
    except OffgraphError as e:
        return check(re.search(pattern, str(e)) is not None, "%s: the error %r does not say %r" % (what, str(e), pattern))
    return check(False, "%s: not refused" % what)


def openai_messages(messages):
    """The fixture's messages (arguments as objects, as templates read them)
    as an OpenAI client sends them (arguments as JSON text)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.dumps(c["function"]["arguments"])))
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def assemble(chunks):
    """(content, [(name, arguments)], finish_reason, ids, pieces) of a
    stream's chunks; pieces: how many deltas brought each call's arguments.
    A call streams as OpenAI streams it: a first delta with its index, id,
    type, name and arguments "", then deltas with only its index and bytes
    of its arguments (one call at a time, in order)."""
    content, calls, finish, ids, pieces = [], [], None, [], []
    for ch in chunks:
        for c in ch["choices"]:
            d = c.get("delta") or {}
            if d.get("content"):
                content.append(d["content"])
            for tc in d.get("tool_calls") or []:
                fn = tc.get("function") or {}
                if "id" in tc:  # a call's first delta
                    check(tc["index"] == len(calls) and tc.get("type") == "function" and isinstance(tc["id"], str)
                          and isinstance(fn.get("name"), str) and fn.get("arguments") == "",
                          "stream: a call's first delta %r (%d calls before it)" % (tc, len(calls)))
                    calls.append([fn.get("name"), ""])
                    ids.append(tc["id"])
                    pieces.append(0)
                    continue
                check(calls and tc["index"] == len(calls) - 1 and set(tc) == {"index", "function"} and
                      set(fn) == {"arguments"} and fn["arguments"],
                      "stream: a delta of arguments %r (after %d calls)" % (tc, len(calls)))
                if calls:
                    calls[-1][1] += fn.get("arguments") or ""
                    pieces[-1] += 1
            if c.get("finish_reason"):
                check(finish is None, "stream: two finish reasons")
                finish = c["finish_reason"]
    return "".join(content), [tuple(c) for c in calls], finish, ids, pieces


def calls_of(message):
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]


def post(port, body):
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        if not body.get("stream"):
            return json.load(r)
        return [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: {")]


def check_rendering(llm, template, cases):
    tok = llm.model.tokenizer
    text = open(cases["__template_path__"]).read()
    bos = tok.bos_id
    eos = tok.eos_id
    n = 0
    for case in cases["cases"]:
        if case["template"] != "chat_templates/%s.jinja" % template or not case["add_generation_prompt"]:
            continue
        what = "%s/%s" % (template, case["conversation"])
        msgs = openai_messages(case["messages"])

        def run():
            return llm.create_chat_completion(msgs, tools=case["tools"], max_tokens=1, temperature=0)

        def render():
            return llm.render_chat(msgs, tools=case["tools"])
        if "error" in case:
            raises(run, re.escape(case["error"]), what + ": the template's refusal")
            raises(render, re.escape(case["error"]), what + ": the template's refusal (render_chat)")
            n += 1
            continue
        expected = case["expected"]
        # the fixture renders with the original model's special tokens; the
        # program has the checkpoint's (qwen3-mixed: no BOS, <|endoftext|>),
        # which the template gets as their tokens' text
        if "bos_token" in text and case["bos_token"]:
            expected = expected.replace(case["bos_token"], tok.id_to_token(bos) if bos is not None else "")
        if "eos_token" in text and case["eos_token"]:
            expected = expected.replace(case["eos_token"], tok.id_to_token(eos))
        got = render()
        at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        if check(got == expected, "%s: the prompt differs from transformers' rendering at byte %d: %r, want %r"
                 % (what, at, got[max(at - 40, 0):at + 80], expected[max(at - 40, 0):at + 80])):
            # and that text is the prompt a request reads
            want = len(tok.encode(expected, add_special=False, parse_special=True))
            got = run()["usage"]["prompt_tokens"]
            check(got == want, "%s: the prompt is %d tokens, its rendering %d" % (what, got, want))
        n += 1
    check(n >= 8, "%s: only %d rendering cases" % (template, n))
    print("check_tools: %s: %d conversations rendered as transformers renders them, text for text" % (template, n))


def check_forced(llm, template, tools):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    streamed_pieces = []
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    n = 0
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        for temperature, seed in ((0, None), (1.0, 7)):
            what = "%s: tool_choice %s, temperature %s" % (template, json.dumps(choice), temperature)
            kw = dict(tools=tools, tool_choice=choice, parallel_tool_calls=False, max_tokens=300,
                      temperature=temperature, seed=seed)
            r = llm.create_chat_completion(msgs, **kw)
            c = r["choices"][0]
            m = c["message"]
            calls = m.get("tool_calls") or []
            if not check(c["finish_reason"] == "tool_calls" and m["content"] is None and len(calls) == 1,
                         "%s: %s" % (what, json.dumps(c))):
                continue
            call = calls[0]
            check(call["type"] == "function" and isinstance(call["id"], str) and call["id"], what + ": " + str(call))
            if template == "mistral-nemo":
                check(re.match(r"^[A-Za-z0-9]{9}$", call["id"]) is not None, what + ": Mistral's id " + call["id"])
            name, args = call["function"]["name"], call["function"]["arguments"]
            check(isinstance(args, str), what + ": arguments are not JSON text")
            try:
                jsonschema.Draft202012Validator(schemas[name]).validate(json.loads(args))
            except (jsonschema.ValidationError, ValueError, KeyError) as e:
                check(False, "%s: the call %s %s: %s" % (what, name, args, e))
            if isinstance(choice, dict):
                check(name == "add", what + ": called " + name)
            n += 1
            # streamed: the same call, its arguments in pieces as they come
            content, scalls, finish, ids, pieces = assemble(llm.create_chat_completion(msgs, stream=True, **kw))
            check((content, scalls, finish) == ("", calls_of(m), "tool_calls"),
                  "%s: streamed %r, not %r" % (what, (content, scalls, finish), calls_of(m)))
            streamed_pieces.append(pieces[0] if pieces else 0)
            # the call and its result sent back
            turn2 = msgs + [m] + [{"role": "tool", "tool_call_id": x["id"], "content": "18"} for x in calls]
            r2 = llm.create_chat_completion(turn2, tools=tools, max_tokens=2, temperature=0)
            check(r2["usage"]["prompt_tokens"] > r["usage"]["prompt_tokens"], what + ": the second turn")
    # how many deltas depends on how many tokens each read of the request
    # finds (a loaded machine may find several): one call in pieces at least
    check(n == 0 or max(streamed_pieces) > 1, "%s: no call's arguments came in pieces: %r" % (template, streamed_pieces))
    print("check_tools: %s: %d forced calls valid, streamed alike (arguments in %r deltas), sent back"
          % (template, n, streamed_pieces))


def check_against_server(llm, template, tools, port):
    msgs = [{"role": "system", "content": "You call tools."}, {"role": "user", "content": "Weather in Oslo?"}]
    back = [{"role": "user", "content": "What is 2 + 40?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call00001" if template == "mistral-nemo" else "c1", "type": "function",
                 "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 40}"}}]},
            {"role": "tool", "tool_call_id": "call00001" if template == "mistral-nemo" else "c1", "content": "42"}]
    requests = []
    for m in (msgs, back):
        for choice in (None, "required", {"type": "function", "function": {"name": "get_weather"}}):
            for temperature, seed in ((0, None), (0.9, 11)):
                body = dict(messages=m, tools=tools, max_tokens=60 if choice is None else 300,
                            temperature=temperature, top_k=40, top_p=0.9, min_p=0.05,
                            parallel_tool_calls=choice is None)
                if choice is not None:
                    body["tool_choice"] = choice
                if seed is not None:
                    body["seed"] = seed
                requests.append(body)
    n = 0
    for body in requests:
        what = "%s: %s" % (template, json.dumps({k: v for k, v in body.items() if k != "tools"})[:160])
        args = dict(body)
        messages = args.pop("messages")
        want = post(port, body)
        got = llm.create_chat_completion(messages, **args)
        wc, gc = want["choices"][0], got["choices"][0]
        check((gc["message"]["content"], calls_of(gc["message"]), gc["finish_reason"]) ==
              (wc["message"]["content"], calls_of(wc["message"]), wc["finish_reason"]),
              "%s: python %r, the server %r" % (what, gc, wc))
        check(got["usage"] == {k: want["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
              "%s: usage %r, the server's %r" % (what, got["usage"], want["usage"]))
        # streamed, both
        s_got = assemble(llm.create_chat_completion(messages, stream=True, **args))
        s_want = assemble(post(port, dict(body, stream=True)))
        check(s_got[:3] == s_want[:3], "%s: streamed: python %r, the server %r" % (what, s_got[:3], s_want[:3]))
        check(s_got[:3] == ((gc["message"]["content"] or ""), calls_of(gc["message"]), gc["finish_reason"]),
              "%s: python streamed %r, not as its own whole reply %r" % (what, s_got[:3], gc))
        n += 1
    print("check_tools: %s: %d requests give the server's content, calls and finish reason" % (template, n))


def calls_main(model, template, port, tools_path, cases_path, src):
    tools = json.load(open(tools_path))
    cases = json.load(open(cases_path))
    cases["__template_path__"] = "%s/tests/data/chat_templates/%s.jinja" % (src, template)
    with Llama(model, n_gpu_layers=0) as llm:
        want = {"qwen3": "hermes", "llama-3.1": "llama3", "mistral-nemo": "mistral"}[template]
        check(llm.model.tokenizer.tool_format == want,
              "%s: tool format %r, not %r" % (template, llm.model.tokenizer.tool_format, want))
        check_rendering(llm, template, cases)
        check_forced(llm, template, tools)
        if port:
            check_against_server(llm, template, tools, port)


def refusals_main(qwen3, demo, other, tools_path):
    tools = json.load(open(tools_path))
    msgs = [{"role": "user", "content": "Hi"}]
    with Llama(qwen3, n_gpu_layers=0) as llm:
        cc = llm.create_chat_completion
        cases = [
            (lambda: cc(msgs, tools=tools, tool_choice="sometimes"), r"tool_choice must be none, auto, required",
             "a tool_choice string"),
            (lambda: cc(msgs, tools=tools, tool_choice={"type": "function"}), r"tool_choice must be",
             "a tool_choice without a function"),
            (lambda: cc(msgs, tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}}),
             r"names 'nope', which is not in tools", "a named function not in tools"),
            (lambda: cc(msgs, tool_choice="required"), r"tool_choice required needs tools", "required without tools"),
            (lambda: cc(msgs, tools=[]), r"tools must be a non-empty list", "empty tools"),
            (lambda: cc(msgs, tools={"type": "function"}), r"tools must be a non-empty list", "tools not a list"),
            (lambda: cc(msgs, tools=[{"type": "retrieval"}]), r"tools\[0\] must be \{\"type\": \"function\"",
             "a tool of another type"),
            (lambda: cc(msgs, tools=[{"type": "function", "function": {"name": "get weather"}}]),
             r"tools\[0\]\.function\.name must be", "a function name with a space"),
            (lambda: cc(msgs, tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
             r"parameters must be a JSON schema", "parameters not a schema"),
            (lambda: cc(msgs, tools=tools, tool_choice="required", grammar='root ::= "x"'),
             r"cannot both constrain", "required and a grammar"),
            (lambda: cc(msgs, tools=tools, tool_choice="required", response_format={"type": "json_object"}),
             r"cannot both constrain", "required and response_format"),
            (lambda: cc(msgs, tools=[{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"a": {"type": "string", "format": "hostname"}}}}}],
                tool_choice="required"), r"hostname", "a parameters schema the compiler refuses"),
            (lambda: cc(msgs + [{"role": "tool", "content": "3"}]), r"needs a string tool_call_id",
             "a tool message without tool_call_id"),
            (lambda: cc([{"role": "user", "content": "x", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}]),
             r"only an assistant message has tool_calls", "tool_calls on a user message"),
            (lambda: cc(msgs + [{"role": "assistant", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "add", "arguments": "not json"}}]}]),
             r"arguments must be a JSON object", "arguments that are not JSON"),
            (lambda: cc(msgs, tools=tools, parallel_tool_calls="yes"), r"parallel_tool_calls must be a bool",
             "parallel_tool_calls not a bool"),
        ]
        for fn, pattern, what in cases:
            raises(fn, pattern, what)
        # tool_choice "none": the tools are not shown
        a = cc(msgs, tools=tools, tool_choice="none", max_tokens=1, temperature=0)
        b = cc(msgs, max_tokens=1, temperature=0)
        check(a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"], "tool_choice none showed the tools")
    with Llama(demo, n_gpu_layers=0) as llm:
        check(llm.model.tokenizer.tool_format == "none", "the demo model's tool format")
        raises(lambda: llm.create_chat_completion(msgs, tools=tools), r"does not take tools", "tools on the demo model")
        r = llm.create_chat_completion(msgs, tools=tools, tool_choice="none", max_tokens=2)
        check(r["choices"][0]["finish_reason"] in ("stop", "length"), "tool_choice none on the demo model")
        llm.create_chat_completion(msgs + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1,\"b\":2}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "3"}], max_tokens=2)
    with Llama(other, n_gpu_layers=0) as llm:
        check(llm.model.tokenizer.tool_format == "other", "the other template's tool format: " +
              llm.model.tokenizer.tool_format)
        raises(lambda: llm.create_chat_completion(msgs, tools=tools), r"a format offgraph does not parse",
               "tools on a template whose calls are not parsed")
        llm.create_chat_completion(msgs, tools=tools, tool_choice="none", max_tokens=2)
    # the parser and grammar as the module gives them
    with offgraph.ToolParser("hermes") as p:
        got = [p.feed(x) for x in ("Sure.\n<tool_", "call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool",
                                   "_call>")] + [p.finish()]
        # a call is complete when its arguments close, before </tool_call>
        check(got == [("Sure.", []), ("", [("add", "{\"a\": 1}")]), ("", []), ("", [])], "ToolParser: %r" % got)
    with offgraph.ToolParser("hermes") as p:
        got = [p.feed_pieces(x) for x in ("Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\"",
                                          ": 1, \"b", "\": 2}}\n</tool", "_call>")] + [p.finish_pieces()]
        check(got == [[(None, None, "Sure.", False), (0, "add", "{", False)], [(0, None, "\"a\": 1", False)],
                      [(0, None, ", \"b\": 2}", True)], [], []], "ToolParser pieces: %r" % got)
    g = offgraph.tool_calls_grammar("hermes", tools, "add", False)
    check(g.startswith("root ::= call\n") and "add" in g and "get_weather" not in g, "tool_calls_grammar: " + g[:200])
    check(offgraph.tool_call_id("hermes", "call_x1") == "call_x1", "tool_call_id hermes")
    check(re.match(r"^[A-Za-z0-9]{9}$", offgraph.tool_call_id("mistral", "call_x1")) is not None, "tool_call_id mistral")
    print("check_tools: refusals ok")


if __name__ == "__main__":
    if sys.argv[1] == "calls":
        calls_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7])
    else:
        refusals_main(*sys.argv[2:6])
    if fails:
        print("check_tools: %d failures" % fails)
        sys.exit(1)

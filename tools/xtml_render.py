#!/usr/bin/env python3
"""Second, independent renderer of the Kimi K3 XTML chat format (standard library only).

It renders the OpenAI-style request of every fixture in tests/data/chat/*.json and compares
the result with the fixture's stored "expected" segments, so the C++ renderer
(src/io/chat_render.cpp) is not checked only against itself. Written from the behaviour of
encoding_k3.py (vllm-project/vllm, vllm/tokenizers/encoding_k3.py); it uses Python's own
json.dumps, so the C++ float and escape formatting is checked against the real thing.

  xtml_render.py check DIR          compare every fixture, exit 1 on any difference
  xtml_render.py render FILE        print the segments of one fixture's request
  xtml_render.py update FILE...     write "expected" and "rendered" from this renderer
                                    (then review the diff by eye against the reference)
"""
import json
import os
import sys

OPEN, CLOSE, SEP, END = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
EFFORTS = ("low", "high", "max")


class Prompt:
    """Accumulates (kind, text) pairs: kind "C" for control, "T" for ordinary text."""

    def __init__(self):
        self.items = []

    def t(self, text):
        if text != "":
            self.items.append(["T", text])

    def c(self, marker):
        self.items.append(["C", marker])

    def tag(self, name, attrs=()):
        self.c(OPEN)
        self.t(name)
        for key, value in attrs:
            escaped = str(value).replace("&", "&amp;").replace('"', "&quot;")
            for piece in (" " + key, '="', escaped, '"'):
                self.t(piece)
        self.c(SEP)

    def end(self, name):
        self.c(CLOSE)
        self.t(name)
        self.c(SEP)

    def message(self, attrs, parts):
        self.tag("message", attrs)
        for p in parts:
            self.t(p)
        self.end("message")
        self.c(END)


def sort_deep(v):
    if isinstance(v, dict):
        return {k: sort_deep(v[k]) for k in sorted(v)}
    if isinstance(v, list):
        return [sort_deep(x) for x in v]
    return v


def compact(v):
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def parts_of(content):
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    return [p["text"] for p in content]


def arguments_of(fn):
    """(dict, raw json block or None) for one call's arguments."""
    a = fn.get("arguments")
    if a is None:
        return {}, None
    if isinstance(a, dict):
        return a, None
    if not a.strip():
        return {}, None
    try:
        parsed = json.loads(a)
    except ValueError:
        return {}, a
    if not isinstance(parsed, dict):
        raise ValueError("arguments must be a JSON object")
    return parsed, None


def type_of(v):
    if isinstance(v, bool):
        return "boolean"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, dict):
        return "object"
    return "array"


def reorder(messages):
    """Runs of tool results follow their assistant's call order when every id matches."""
    out, calls = [], {}
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") == "assistant":
            calls = {}
            for pos, tc in enumerate(m.get("tool_calls") or [], 1):
                if tc.get("id") is not None and str(tc["id"]) not in calls:
                    calls[str(tc["id"])] = (pos, tc.get("function", tc).get("name"))
        if m.get("role") != "tool":
            out.append((m, None))
            i += 1
            continue
        j = i
        while j < len(messages) and messages[j].get("role") == "tool":
            j += 1
        run = messages[i:j]
        keys = []
        for off, r in enumerate(run):
            cid = r.get("tool_call_id", r.get("id"))
            keys.append(calls.get(str(cid)) if cid is not None else None)
        if all(k is not None for k in keys):
            order = sorted(range(len(run)), key=lambda o: (keys[o][0], o))
            out.extend((run[o], keys[o][1]) for o in order)
        else:
            out.extend((r, None) for r in run)
        i = j
    return out


def options(req):
    kw = req.get("chat_template_kwargs") or {}

    def opt(key):
        v = kw.get(key)
        return v if v is not None else req.get(key)

    thinking = opt("thinking")
    if thinking is None:
        thinking = opt("enable_thinking")
    if thinking is None:
        thinking = True
    effort = opt("thinking_effort")
    reasoning_effort = opt("reasoning_effort")
    if reasoning_effort == "none":
        thinking = False
    elif effort is None and reasoning_effort is not None:
        effort = reasoning_effort
    effort = effort or "max"
    if effort not in EFFORTS:
        raise ValueError("bad effort " + effort)
    return thinking, effort


def render(req):
    p = Prompt()
    thinking, effort = options(req)
    tools = req.get("tools")
    if tools:
        p.message([("role", "system"), ("type", "tool-declare")],
                  ["# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n"
                   + compact(sort_deep(tools)) + "\n```"])
    if thinking:
        p.message([("role", "system"), ("type", "thinking-effort")],
                  ["`thinking_effort` guides on how much to think in your thinking channel "
                   "(not including the response channel), supported values include `low`, "
                   "`medium`, `high`, and `max`.\nNow the system is invoked with "
                   "`thinking_effort=%s`." % effort])
    last_calls, k = None, 0
    for m, resolved in reorder(req["messages"]):
        role = m["role"]
        named = [("name", m["name"])] if m.get("name") else []
        if role == "user":
            p.message([("role", "user")] + named, parts_of(m.get("content")))
        elif role == "system" and m.get("tools"):
            p.message([("role", "system"), ("type", "tool-declare")],
                      ["## New Tools Available\nThe system dynamically extends the toolset via "
                       "lazy-loading.\nYou have access to all existing and extended tools.\nHere "
                       "are the specs for the extended tools.\n\n```json\n"
                       + compact(sort_deep(m["tools"])) + "\n```"])
        elif role == "system":
            p.message([("role", "system")] + named, parts_of(m.get("content")))
        elif role == "tool":
            k += 1
            name = resolved if resolved is not None else m.get("tool", m.get("name"))
            if name is None and last_calls and k <= len(last_calls):
                name = last_calls[k - 1].get("function", last_calls[k - 1])["name"]
            if name is None:
                raise ValueError("unresolvable tool name")
            p.message([("role", "tool"), ("tool", name), ("index", k)], parts_of(m.get("content")))
        elif role == "assistant":
            last_calls, k = m.get("tool_calls"), 0
            p.tag("message", [("role", "assistant")] + named)
            if thinking:
                p.tag("think")
                r = m.get("reasoning_content") or m.get("reasoning")
                if r is not None and str(r).strip():
                    p.t(r)
                p.end("think")
            p.tag("response")
            for part in parts_of(m.get("content")):
                p.t(part)
            p.end("response")
            if last_calls:
                p.tag("tools")
                for n, tc in enumerate(last_calls, 1):
                    fn = tc.get("function", tc)
                    args, block = arguments_of(fn)
                    p.tag("call", [("tool", fn["name"]), ("index", n)])
                    if block is not None:
                        p.tag("json", [("type", "object")])
                        p.t(block)
                        p.end("json")
                    else:
                        for key, v in args.items():
                            p.tag("argument", [("key", key), ("type", type_of(v))])
                            p.t(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))
                            p.end("argument")
                    p.end("call")
                p.end("tools")
            p.end("message")
            p.c(END)
        else:
            raise ValueError("unknown role " + str(role))
    choice = req.get("tool_choice")
    if choice == "required":
        p.message([("role", "system"), ("type", "tool-choice")],
                  ["The system is invoked with `tool_choice=required`.\n"
                   "You MUST call tools in the next message."])
    elif choice == "none":
        p.message([("role", "system"), ("type", "tool-choice")],
                  ["The system is invoked with `tool_choice=none`.\n"
                   "You MUST NOT call any tools in the next message."])
    rf = req.get("response_format")
    rf_type = rf.get("type") if isinstance(rf, dict) else rf
    raw = ("Your response must be raw JSON data without markdown code blocks (```json) or any "
           "additional formatting.")
    if rf_type == "json_object":
        p.message([("role", "system"), ("type", "response-format")],
                  ["The system is invoked with `response_format=json_object`.\n" + raw])
    elif rf_type == "json_schema":
        js = rf["json_schema"]
        schema = js["schema"] if "schema" in js else js.get("json_schema", js)
        p.message([("role", "system"), ("type", "response-format")],
                  ["The system is invoked with `response_format=json_schema`.\n" + raw
                   + "\nThe JSON data must match the following schema:\n```json\n"
                   + compact(sort_deep(schema)) + "\n```"])
    if req.get("add_generation_prompt", True):
        p.tag("message", [("role", "assistant")])
        p.tag("think" if thinking else "response")
    return p.items


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def main(argv):
    if len(argv) >= 3 and argv[1] == "check":
        files = sorted(f for f in os.listdir(argv[2]) if f.endswith(".json"))
        bad = 0
        checked = 0
        for name in files:
            fx = load(os.path.join(argv[2], name))
            if "expected" not in fx:
                continue
            checked += 1
            got = render(fx["request"])
            if got != fx["expected"] or "".join(t for _, t in got) != fx.get("rendered"):
                bad += 1
                print("MISMATCH %s" % name)
                for i, (a, b) in enumerate(zip(got, fx["expected"])):
                    if a != b:
                        print("  first difference at segment %d: got %r, expected %r" % (i, a, b))
                        break
                else:
                    print("  lengths differ: got %d, expected %d" % (len(got), len(fx["expected"])))
        print("%d fixtures checked, %d mismatches" % (checked, bad))
        return 1 if bad or checked == 0 else 0
    if len(argv) == 3 and argv[1] == "render":
        print(json.dumps(render(load(argv[2])["request"]), ensure_ascii=False, indent=1))
        return 0
    if len(argv) >= 3 and argv[1] == "update":
        for path in argv[2:]:
            fx = load(path)
            fx["expected"] = render(fx["request"])
            fx["rendered"] = "".join(t for _, t in fx["expected"])
            with open(path, "w", encoding="utf-8") as f:
                json.dump(fx, f, ensure_ascii=False, indent=1)
                f.write("\n")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

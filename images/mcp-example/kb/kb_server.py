#!/usr/bin/env python3
"""A small MCP server over stdio (stdlib only, Python >= 3.8): a read-only knowledge base of
support articles, the example of an MCP server run inside an episode's container.

Tools: ``search`` (articles whose title or body holds every word of a query; structured
results) and ``get_article`` (one article's text by id; an unknown id is a tool error, which MCP
reports with ``isError``, not as a protocol error). One JSON-RPC 2.0 message per line on stdin
and stdout; the server exits when stdin closes. The articles come from ``articles.json`` beside
this file, or from ``KB_ARTICLES``.
"""

import json
import os
import sys

PROTOCOL_VERSION = "2025-06-18"

TOOLS = [
    {
        "name": "search",
        "description": "Search the support knowledge base; every word of the query must match.",
        "inputSchema": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "words to look for"}},
            "required": ["query"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {"results": {"type": "array", "items": {"type": "object"}}},
            "required": ["results"],
        },
    },
    {
        "name": "get_article",
        "description": "Read one knowledge-base article by id (e.g. KB-1).",
        "inputSchema": {
            "type": "object",
            "properties": {"id": {"type": "string"}},
            "required": ["id"],
            "additionalProperties": False,
        },
    },
]


def load_articles():
    path = os.environ.get("KB_ARTICLES") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "articles.json")
    with open(path) as f:
        return json.load(f)


def call_tool(name, arguments, articles):
    """The result of ``tools/call``."""
    if name == "search":
        words = str(arguments.get("query", "")).lower().split()
        hits = [
            {"id": a["id"], "title": a["title"]}
            for a in articles
            if all(w in (a["title"] + " " + a["body"]).lower() for w in words)
        ]
        text = "\n".join("%s: %s" % (h["id"], h["title"]) for h in hits) or "no article matches"
        return {"content": [{"type": "text", "text": text}], "structuredContent": {"results": hits}}
    if name == "get_article":
        for article in articles:
            if article["id"] == arguments.get("id"):
                return {"content": [{"type": "text", "text": "%s\n\n%s" % (article["title"], article["body"])}]}
        return {"content": [{"type": "text", "text": "no article %s" % arguments.get("id")}], "isError": True}
    return None


def answer(message, articles):
    """The response to one request (None for a notification)."""
    method, request_id = message.get("method"), message.get("id")
    if request_id is None:
        return None
    params = message.get("params") or {}
    if method == "initialize":
        result = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "softprobe-kb", "version": "1.0"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        result = call_tool(params.get("name"), params.get("arguments") or {}, articles)
        if result is None:
            error = {"code": -32602, "message": "unknown tool %r" % params.get("name")}
            return {"jsonrpc": "2.0", "id": request_id, "error": error}
    else:
        return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "no method %r" % method}}
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def main():
    articles = load_articles()
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = answer(json.loads(line), articles)
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

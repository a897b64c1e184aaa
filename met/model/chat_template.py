"""Chat templates: a conversation rendered to the prompt text a model was tuned on, as transformers renders it.

A checkpoint folder's template is `chat_template.jinja` or the `chat_template` of its
tokenizer_config.json (a string, or a list of named templates of which "default" is taken), as
transformers reads it. It is rendered as transformers' `apply_chat_template` renders it: jinja2's
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension and
the `{% generation %}` tag, the `raise_exception` and `strftime_now` helpers, a `tojson` filter
that does not escape HTML, the sandbox-safe `dict` and `namespace`; the variables `messages`
(keys whose value is null dropped, reasoning fields aliased), `tools`, `documents`,
`add_generation_prompt` and the tokenizer's special tokens (`bos_token`, `eos_token`, ...) as text.
The rendered text is tokenized without adding special tokens: the template writes them.

The embedded byte-level recipes were trained on Python source, not on conversations; they get
EMBEDDED_TEMPLATE, each message a comment line naming its role and then its text:

    # user:
    Write a function that adds two numbers.
    # assistant:

A turn ends at the model's end-of-sequence token (the byte tokenizer's EOS).
"""

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from met.model.errors import CheckpointError
from met.model.recipes import Recipe

EMBEDDED_TEMPLATE = (
    "{% for message in messages %}# {{ message['role'] }}:\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}# assistant:\n{% endif %}"
)
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' aliases of a message's reasoning


class TemplateError(ValueError):
    """The template cannot render this conversation (it raised, or is not valid Jinja); the message says why."""


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A chat template and the special tokens it may write; `end_of_turn` ends a generated turn."""

    source: str  # the Jinja text
    tokens: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token, ... as text (those the tokenizer has)
    origin: str = "embedded"  # where it came from (a file path), for messages

    @property
    def end_of_turn(self) -> str | None:
        """The text of the token that ends a turn (the tokenizer's eos_token), if it has one."""
        return self.tokens.get("eos_token")

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None,
               documents: list | None = None, variables: dict | None = None) -> str:
        """The prompt text of a conversation; TemplateError if the template refuses it or fails.

        variables: more for the template to read (a request's chat_template_kwargs); they win over the special
        tokens, as in transformers, and never over the conversation's own.
        """
        import jinja2

        chat = [_aliased({k: v for k, v in m.items() if v is not None}) for m in messages]
        context = self.tokens | (variables or {}) | {"messages": chat, "tools": tools, "documents": documents,
                                                     "add_generation_prompt": add_generation_prompt}
        try:
            return _compiled(self.source).render(context)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template ({self.origin}) refused the conversation: {exc}") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            raise TemplateError(f"the chat template ({self.origin}) failed on the conversation: "
                                f"{type(exc).__name__}: {exc}") from None


EMBEDDED = ChatTemplate(EMBEDDED_TEMPLATE)


def _aliased(message: dict) -> dict:
    """transformers' reasoning aliases: reasoning_content and thinking filled from whichever the message has."""
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    return message if reasoning is None else {"thinking": reasoning, **message, "reasoning_content": reasoning}


@lru_cache(maxsize=8)
def _compiled(source: str):
    """The template compiled in transformers' environment (its _compile_jinja_template)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        # `{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering keeps its body
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class TemplateDict:
        # the sandbox's `dict`: a call and fromkeys, no attribute access past them
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        # namespaces refuse underscore names, so a template cannot reach CPython internals through one
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot store {name!r} on a namespace")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"the chat template is not valid Jinja (line {exc.lineno}: {exc.message})") from None


def load_template(folder: Path) -> ChatTemplate | None:
    """A checkpoint folder's chat template, or None if it has none; TemplateError for one that cannot be read."""
    config: dict = {}
    path = folder / "tokenizer_config.json"
    if path.is_file():
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TemplateError(f"cannot read {path}: {exc}") from None
        if not isinstance(config, dict):
            raise TemplateError(f"{path} is not a JSON object")
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        try:
            source, origin = jinja.read_text(encoding="utf-8"), str(jinja)
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateError(f"cannot read {jinja}: {exc}") from None
    else:
        source, origin = _named(config.get("chat_template")), str(path)
    if not source:
        return None
    tokens = {}
    for name in SPECIAL_TOKENS:
        value = config.get(name)
        text = value.get("content") if isinstance(value, dict) else value
        if isinstance(text, str):
            tokens[name] = text
    _compiled(source)  # a syntax error is the operator's to fix at boot, not every client's
    return ChatTemplate(source, tokens, origin)


def _named(value: object) -> str | None:
    """tokenizer_config's chat_template: a string, or [{"name", "template"}, ...] of which "default" is used."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        found = named.get("default")
        return found if isinstance(found, str) else None
    return None


def template_for(recipe: Recipe) -> ChatTemplate | None:
    """A recipe's chat template: EMBEDDED for an embedded recipe, a checkpoint folder's own (None if it has none).

    CheckpointError for a folder's template that cannot be read or is not valid Jinja.
    """
    if recipe.source != "hf":
        return EMBEDDED
    try:
        return load_template(recipe.weights)
    except TemplateError as exc:
        raise CheckpointError(str(exc)) from None

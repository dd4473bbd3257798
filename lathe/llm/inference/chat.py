"""`lathe chat CONFIG [key=value ...]`: talk to the model in the terminal, with the template it was
trained with. Replies stream as they are generated; `clear` forgets the conversation, `exit` (or
end of input) quits. Generation settings come from the config's generation keys, overridable on the
command line (`temperature=0.2 max_new_tokens=128`)."""

from __future__ import annotations

import sys

from lathe.llm.inference.engine import ChatEngine, InvalidRequest

WELCOME = "Chat with the model: `clear` forgets the conversation, `exit` quits."


def chat_loop(engine: ChatEngine, system: str | None = None, read=input, write=None) -> int:
    """The loop itself; `read(prompt)` gives a line (EOFError ends), `write(text)` prints."""

    def default_write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    write = write or default_write
    write(WELCOME + "\n")
    history: list[dict] = []
    while True:
        try:
            query = read("\nUser: ").strip()
        except (EOFError, KeyboardInterrupt):
            write("\n")
            return 0
        if query == "exit":
            return 0
        if query == "clear":
            history = []
            write("The conversation is cleared.\n")
            continue
        if not query:
            continue
        messages = (
            ([{"role": "system", "content": system}] if system else []) + history + [{"role": "user", "content": query}]
        )
        try:
            prompt_ids = engine.chat_prompt(messages)
            params = engine.check_length(prompt_ids, engine.default_params())
        except InvalidRequest as error:
            write(f"(not sent: {error} Type `clear` to start a new conversation.)\n")
            continue
        write("Assistant: ")
        sequence = engine.generate(prompt_ids, params, on_text=write)
        if sequence.finish_reason == "length":
            write(" [cut at max_new_tokens]")
        write("\n")
        history += [{"role": "user", "content": query}, {"role": "assistant", "content": sequence.text}]


def chat_command(config_path: str, overrides: list[str]) -> int:
    from lathe.llm.inference.config import parse_infer_config

    config = parse_infer_config(config_path, overrides, command="chat")
    engine = ChatEngine.from_config(config, max_batch=1)
    return chat_loop(engine)  # the template carries default_system, as in training

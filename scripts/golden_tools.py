"""The function tool that both chat-template golden generators put in their conversations
(scripts/chat_template_goldens.py for src/template, scripts/tokenizer_goldens_chat.py for the tokenizer's chat
path), kept in one place so that both golden sets render the same definition."""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}

"""The serving room: what people talk to.

The pipeline service (`services`), the API and the chat page (`api`, `web`, `static/`), the
conversation store (`checkpoint`, `conversation`), the decision log (`decision_log`), deadlines
(`deadline`) and live progress (`progress`). It imports everything below it; nothing in the
library imports it.
"""

"""The small corpus the serving tests retrieve from and cut phrases of (tests import it from here, not from a
conftest)."""

DOCS = [
    {"id": "nyc", "title": "New York", "text": "New York City is the most populous city in the United States. "
                                               "New York City lies on the Hudson River."},
    {"id": "paris", "title": "Paris", "text": "Paris is the capital of France. The Seine river flows through Paris."},
    {"id": "tokyo", "title": "Tokyo", "text": "Tokyo is the capital of Japan. Greater Tokyo is the largest city."},
]

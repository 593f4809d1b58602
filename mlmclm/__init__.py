__version__ = "0.1.0"

# Opening an mlmclm MLM checkpoint with `transformers.pipeline("fill-mask", ...)` needs a masked-LM class for the
# Llama layout; importing the package registers it (cheap: no weights, no network).
from .model import register_with_transformers as _register_with_transformers

_register_with_transformers()

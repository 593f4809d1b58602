"""A call that must return in time: a reader blocked on a FIFO fails its test instead of hanging the test command."""
import threading


def finishes(f, timeout=20.0):
    "f()'s value, or a failure when it has not returned within `timeout` seconds (a reader blocked on a FIFO)."
    out = {}
    def call():
        try: out['v'] = f()
        except BaseException as e: out['e'] = e
    t = threading.Thread(target=call, daemon=True)
    t.start(); t.join(timeout)
    assert not t.is_alive(), f'{f} still blocked after {timeout} s'
    if 'e' in out: raise out['e']
    return out.get('v')

import gc
def test_gc():
    gc.collect()

"""Experiments that run the simulator many times to answer one question: the CLAIRVOYANT Oracle's
schedule search (``oracle_search``). They sit above the simulator, which never imports them
(``tests/test_layers.py``); the pipeline and the command line call them."""

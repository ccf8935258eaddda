"""The linear probe: the L-BFGS probe on features in memory (lbfgs), MoCo's SGD probe on features Ray Data extracts
to disk (sgd), a pretrained backbone against its random-init twin (compare), and jobs/linear_probe.py's settings
(spec), command line (job) and run (run)."""

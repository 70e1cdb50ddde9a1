"""A leased GPU, made to count: what its device calls run and what they carry. Not needed to use pelab; the steps,
their limits and the calls are in docs/performance.md#gpu-session.

    session.sh  bash experiments/gpu_lease/session.sh STEP ...: the command a device call runs (from the repository
                root, output unbuffered, results under the device tool's $OUT)
    session.py  python -m experiments.gpu_lease.session: the steps (the CUDA suite, the learning-rate sweep, the bench,
                the GPU cost tables, the gpu preset, the real model), each under its own limit and packed as it ends;
                --dry-run goes through them on this CPU at a micro scale
    carry.py    python -m experiments.gpu_lease.carry (make gpu-carry): what the calls carry (wheels, prepared books, a
                book, the GGUF file in parts), sized to each call, and the calls in order
"""

"""The index on a GPU (faiss-gpu) finds what the CPU index finds: run by ``make test-gpu`` where faiss sees a GPU."""

import numpy as np
import pytest

from retrieval import DocumentIndex
from retrieval.index.ann import IndexConfig, exact_search, gpu_available, is_gpu_index, recall_at_k

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_available(), reason="needs faiss-gpu and a GPU")]


@pytest.mark.parametrize("kind", ["flat", "ivf", "ivfpq"])
def test_a_gpu_index_recalls_what_the_cpu_index_recalls(kind):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((20_000, 64)).astype(np.float32)
    queries = vectors[:500] + 0.05 * rng.standard_normal((500, 64)).astype(np.float32)
    config = IndexConfig(index_type=kind, nprobe=32 if kind != "flat" else None, pq_m=16)
    gpu = DocumentIndex.build([str(i) for i in range(len(vectors))], vectors=vectors, config=config)
    cpu = DocumentIndex.build([str(i) for i in range(len(vectors))], vectors=vectors,
                              config=IndexConfig(**{**config.to_dict(), "use_gpu": False}))
    assert is_gpu_index(gpu._index) and not is_gpu_index(cpu._index)
    exact_ids = exact_search(vectors, queries, 10)[1]
    on_gpu, on_cpu = (recall_at_k(index.search(queries, 10)[1], exact_ids) for index in (gpu, cpu))
    assert on_gpu >= on_cpu - 0.01, (on_gpu, on_cpu)
    if kind == "flat":
        assert on_gpu == 1.0

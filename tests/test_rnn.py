"""nn.LSTM / nn.GRU and their cells on tpu (the fused cells in lowering/rnn.py) match CPU."""
from __future__ import annotations

import pytest
import torch

from conftest import check_all_modes

CASES = {
    "lstm": lambda: torch.nn.LSTM(5, 6, num_layers=2, batch_first=True),
    "lstm_no_bias": lambda: torch.nn.LSTM(5, 6, bias=False),
    "gru": lambda: torch.nn.GRU(5, 6, num_layers=2),
    "gru_no_bias": lambda: torch.nn.GRU(5, 6, bias=False, batch_first=True),
    "lstm_cell": lambda: torch.nn.LSTMCell(5, 6),
    "gru_cell": lambda: torch.nn.GRUCell(5, 6),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_recurrent_forward_and_backward_match_cpu(name):
    def run(d):
        torch.manual_seed(0)
        m = CASES[name]().to(d)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(*((3, 5) if "cell" in name else (3, 4, 5)), generator=g).to(d).requires_grad_()
        out = m(x)
        first = out[0] if isinstance(out, tuple) else out
        flat = [first] + ([t for t in out[1]] if isinstance(out, tuple) and isinstance(out[1], tuple)
                          else list(out[1:]) if isinstance(out, tuple) else [])
        sum(t.square().sum() for t in flat).backward()
        return flat + [x.grad] + [p.grad for p in m.parameters()]

    check_all_modes(run, rtol=1e-5, atol=1e-5)

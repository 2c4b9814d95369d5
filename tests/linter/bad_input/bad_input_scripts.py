"""The training script the bad-input tests lint and fix (imported by name: see conftest)."""

# ACL101 at line 8 (a raw backward under Accelerate); its safe fix is `accelerator.backward(loss)`.
SCRIPT = """import torch
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    loss = model(batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""
FIXED = SCRIPT.replace("loss.backward()", "accelerator.backward(loss)")
FINDING = "ACL101 [*] raw backward bypasses `accelerator.backward(loss)`"

"""Host-side serving drivers above the kernels: ``SpecDecodeStep`` (the carried-state protocol
for a stack of layers, ``spec_decode_step``) and ``CarryLayer`` (one layer of it,
``carry_layer``), re-exported by ``pmll_lab.carry``; ``RingStep`` and ``RingLayer``, the ring
form's driver and layer (``ring_step``). They import the kernels' launchers (``pmll_lab.ops``)
and nothing above them. ``pmll_lab.models`` drives real models through them."""

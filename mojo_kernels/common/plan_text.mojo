"""The output of the launch-plan ops: text written into a uint8 tensor, NUL-padded."""


def write_nul_padded(
    dst: Pointer[UInt8, MutAnyOrigin], capacity: Int, text: String, op_name: StaticString
) raises:
    """Writes `text` as ASCII into dst[0:capacity], padding with NUL bytes.

    Raises an Error naming `op_name` when the text (plus one NUL) does not fit.
    """
    var bytes = text.as_bytes()
    if len(bytes) >= capacity:
        raise Error(op_name, ": plan text of ", len(bytes), " bytes exceeds ", capacity)
    for i in range(capacity):
        dst[unsafe_offset=i] = bytes[i] if i < len(bytes) else UInt8(0)

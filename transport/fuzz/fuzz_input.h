// Decoder fuzzing: how a fuzz input becomes frames, shared by the libFuzzer
// target (decoder_fuzzer.cc), the seed generator and the corpus replay test.
//
// Input format: a sequence of frames, each a little-endian u32 length then
// that many bytes (a length past the end takes what is left). Frames point
// into the input itself, so they are usually not 8-byte aligned: the
// decoder's copy path is exercised too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/transport/message.h"

namespace troupe::transport::fuzz {

// Splits `data` into frames (views into `data`).
std::vector<FrameRef> SplitFrames(const uint8_t* data, size_t size);
// Encodes frames in the input format.
std::string JoinFrames(const std::vector<std::string>& frames);
// The frames one transmission of `m` puts on the wire (header with `ack_floor`, then the
// segments), sealed as sent by `sender`.
std::vector<std::string> EncodeFrames(const OutMessage& m, uint64_t ack_floor,
                                      std::string_view sender = "seed");
// Decodes one input with small limits and, if it decodes, reads every tensor
// of the common kinds and every byte of them. Returns 1 if it decoded.
int DecodeOne(const uint8_t* data, size_t size);
// Good messages of several kinds, in the input format (the seed corpus).
std::vector<std::pair<std::string, std::string>> SeedInputs();

}  // namespace troupe::transport::fuzz

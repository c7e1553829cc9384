// The shm backend: one copy into POSIX shared memory that receivers on the
// learner's node map (shm_segment.h).
//
// The learner packs version v straight into the segment slot not used by v-1
// (the one copy of the whole broadcast) and publishes it with a seqlock
// generation; the manifest names segment, slot offset and generation, and
// receivers check the generation before and after they use the bytes. The
// learner rewrites a slot only two versions later, after every member
// acknowledged the version in between; a receiver that was dropped and still
// reads sees the generation change and reports the version as torn.
//   zero copy (receiver shm_zero_copy, with a sink): the sink gets views over
//             the segment, valid until it returns;
//   otherwise the receiver copies the slot into its own memory first.
// Members on another node (Register.node differs from the learner's) get the
// same version over the chunk stream (star) in the same broadcast. Segments
// are created mode 0600 (the job's user only) and unlinked by their learner;
// a learner removes segments of dead learners with the same prefix.
#pragma once

#include <memory>

#include "data_path.h"

namespace troupe::broadcast {

Result<std::unique_ptr<SenderPath>> NewShmSenderPath(const SenderContext& context);
Result<std::unique_ptr<ReceiverPath>> NewShmReceiverPath(const ReceiverContext& context);

}  // namespace troupe::broadcast

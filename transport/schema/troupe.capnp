# Troupe wire schema: every message any actor, the head or the CLI exchanges.
#
# Every message is one Envelope. The union `body` is the message kind; a kind
# this build does not know (a newer sender) is rejected by the decoder with an
# error naming its ordinal. Bulk numbers (token ids, log-probs, masks, weights)
# travel as Tensor values whose `data` is a Data blob the sender references
# without copying and the transport sends as its own ZeroMQ frame, so the
# receiver gets a view over the frame (see transport/include/troupe/transport/).
#
# Compatibility: add fields only at the end with new ordinals; bump
# `schemaVersion` for anything a peer of the old version would misread.
@0xd4c1a93b5e7f2a61;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::wire");

# Receivers reject an Envelope whose schemaVersion differs.
const schemaVersion :UInt16 = 1;

# ---------------------------------------------------------------- envelope

struct Envelope {
  schemaVersion @0 :UInt16;    # must equal the constant `schemaVersion`
  sender @1 :Text;             # actor id of the sender ("rollout-0", "head", "cli")
  seq @2 :UInt64;              # per-sender sequence number for reliable delivery (1, 2, ...); 0 = unsequenced
  sendTimeNs @3 :Int64;        # sender's wall clock, ns since the Unix epoch
  incarnation @4 :UInt64;      # sender's process incarnation (random per start): dedupe state resets when it changes

  body :union {
    register @5 :Register;
    heartbeat @6 :Heartbeat;
    directory @7 :Directory;
    control @8 :Control;
    controlReply @9 :ControlReply;
    logRecord @10 :LogRecord;
    rolloutBatch @11 :RolloutBatch;
    scoredBatch @12 :ScoredBatch;
    retiredPolicyVersion @13 :Void;  # was a PUB of the learner's version; credits replaced it (never sent)
    weightsManifest @14 :WeightsManifest;
    weightsChunk @15 :WeightsChunk;
    ack @16 :Ack;
    metrics @17 :Metrics;
    broadcastGroup @18 :BroadcastGroup;
    echo @19 :Echo;
    credit @20 :Credit;
    storeRequest @21 :StoreRequest;
    storeReply @22 :StoreReply;
  }
}

# ---------------------------------------------------------------- common types

enum Role {
  unknown @0;
  head @1;
  learner @2;
  rollout @3;
  reward @4;
  cli @5;
  echo @6;       # the reference actor (actors/echo)
}

enum ActorState {
  starting @0;   # spawned, not yet registered
  ready @1;      # registered and serving
  busy @2;       # serving (a role may report finer state in stats)
  draining @3;   # finishing in-flight work before removal
  stopping @4;   # asked to stop
  exited @5;     # exited cleanly
  failed @6;     # exited with an error or was killed
  lost @7;       # missed heartbeats beyond the timeout
}

enum DType {
  float32 @0;
  float16 @1;
  bfloat16 @2;
  float64 @3;
  int8 @4;
  uint8 @5;
  int16 @6;
  int32 @7;
  int64 @8;
  bool @9;       # one byte per element, 0 or 1
}

# A dense tensor: dtype, shape and raw little-endian row-major bytes.
# data.size() must equal product(shape) * itemsize(dtype); decoders check it.
struct Tensor {
  dtype @0 :DType;
  shape @1 :List(Int64);
  data @2 :Data;
}

# A named scalar statistic (throughput, counters, losses).
struct Stat {
  name @0 :Text;
  value @1 :Float64;
}

# A named network address an actor listens on ("data" -> "tcp://10.0.0.2:41234").
struct NamedEndpoint {
  name @0 :Text;
  address @1 :Text;
}

# ---------------------------------------------------------------- control plane

# actor -> head, first message after start (and again after a head restart).
struct Register {
  actorId @0 :Text;            # unique within the job ("rollout-3")
  role @1 :Role;
  node @2 :Text;               # host name the actor runs on
  pid @3 :Int32;
  endpoints @4 :List(NamedEndpoint);  # sockets this actor bound, by purpose
  policyVersion @5 :UInt64;    # version the actor holds (rollout/learner), 0 if none
  restarts @6 :UInt32;         # how many times the supervisor restarted this actor id
  adapters @7 :AdapterLayout;  # weight broadcast only: the LoRA adapters the receiver's engine
                               # applies, so the learner refuses a mismatch at group formation
}

# What a weight receiver's engine can apply (Register.adapters): the learner compares it with
# the adapters it trains and refuses a receiver that could not apply them, naming the mismatch.
struct AdapterLayout {
  declared @0 :Bool;           # false: not stated (checked at the first transfer instead)
  rank @1 :UInt32;             # LoRA rank r; 0 = no lora config (full weights only)
  alpha @2 :Float64;           # effective lora_alpha (scale = alpha / rank)
  targets @3 :List(Text);      # PEFT module names ("q_proj", ...)
  tensors @4 :List(AdapterTensor);  # every adapter tensor, PEFT names, in the engine's order
}

struct AdapterTensor {
  name @0 :Text;               # "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
  shape @1 :List(Int64);
}

# actor -> head, every heartbeat interval. Missing heartbeats mark the actor lost.
struct Heartbeat {
  state @0 :ActorState;
  policyVersion @1 :UInt64;    # version the actor holds now
  stats @2 :List(Stat);        # role-specific figures (tokens/s, queue depth, ...)
}

# Everything an actor or the CLI needs to know about one actor.
struct ActorInfo {
  actorId @0 :Text;
  role @1 :Role;
  node @2 :Text;
  pid @3 :Int32;
  state @4 :ActorState;
  endpoints @5 :List(NamedEndpoint);
  policyVersion @6 :UInt64;
  restarts @7 :UInt32;
  lastHeartbeatNs @8 :Int64;   # wall clock of the last heartbeat (0: never)
  stats @9 :List(Stat);        # the last heartbeat's stats
}

# head -> actors, whenever membership changes (and on request).
# `epoch` increases with every change; receivers ignore older epochs.
struct Directory {
  epoch @0 :UInt64;
  actors @1 :List(ActorInfo);
}

# CLI -> head (and head -> actor) commands.
struct Control {
  requestId @0 :UInt64;        # echoed in ControlReply
  command :union {
    status @1 :Void;           # reply carries the actor table
    stop @2 :Void;             # graceful stop: learner checkpoints, everyone exits
    scale @3 :Scale;           # set the number of actors of a role
    drain @4 :Void;            # head -> actor: finish in-flight work, then exit
    checkpoint @5 :Void;       # head -> learner: write a checkpoint now
    shutdown @6 :Void;         # head -> actor: exit now (after flushing logs)
    runInfo @7 :Void;          # reply carries run folder, job name, progress
  }
  targetIncarnation @8 :UInt64;  # head -> actor: the incarnation the command is for; another
                                 # incarnation with the same id ignores it (0: any)
}

struct Scale {
  role @0 :Role;
  count @1 :UInt32;
}

struct ControlReply {
  requestId @0 :UInt64;
  ok @1 :Bool;
  error @2 :Text;              # set when ok is false: one line naming the problem
  message @3 :Text;            # human-readable summary
  actors @4 :List(ActorInfo);  # for `status`
  progress @5 :List(Stat);     # job progress (step, reward, lag, tokens/s, ...)
  runDir @6 :Text;
}

# actor -> head: one log line (the head writes it to logs/<actor>.log).
struct LogRecord {
  timeNs @0 :Int64;
  level @1 :UInt8;             # spdlog level: 0 trace .. 5 critical
  logger @2 :Text;             # component ("transport", "engine", ...)
  text @3 :Text;               # the formatted line, without trailing newline
}

# learner -> head: per-step metrics (the head appends them to metrics.jsonl).
struct Metrics {
  step @0 :UInt64;
  policyVersion @1 :UInt64;
  kind @2 :Text;               # "train", "eval", "summary", ...
  stats @3 :List(Stat);
  json @4 :Text;               # optional structured extras (histograms), a JSON object
}

# ---------------------------------------------------------------- data plane

enum FinishReason {
  stop @0;                     # a stop token was sampled
  length @1;                   # max new tokens reached
  rejected @2;                 # the request could not run (see SequenceMeta.rejectReason)
  submitted @3;                # multi-turn episode ended by the model's submit action
  turnLimit @4;                # multi-turn episode hit its turn limit
}

# Per-sequence scalars and task metadata of a RolloutBatch.
struct SequenceMeta {
  promptId @0 :Text;           # id of the prompt in its task set
  groupIndex @1 :UInt32;       # sequences sharing a prompt share a group index
  finishReason @2 :FinishReason;
  rejectReason @3 :Text;
  task @4 :Text;               # task name the verifier is looked up by
  reference @5 :Text;          # expected answer / verifier input (may be empty)
  service @6 :Text;            # external reward service name (empty: default)
  promptText @7 :Text;         # rendered prompt text (for external verifiers and logs)
  responseText @8 :Text;       # decoded response text
  extra @9 :Text;              # task-specific JSON (tool flags, turn count, ...)
}

# rollout -> reward. Sequences are stored column-wise: the token data of all
# sequences is concatenated and `*Offsets` give each sequence's range, so a
# batch is a handful of large Data frames instead of thousands of small lists.
struct RolloutBatch {
  batchId @0 :Text;            # globally unique ("rollout-1/i3/42"): receivers dedupe by it
  policyVersion @1 :UInt64;    # version of the weights at generation start (invariant 1)
  producer @2 :Text;           # rollout actor id
  numSequences @3 :UInt32;
  groupSize @4 :UInt32;        # samples per prompt (G)
  promptTokens @5 :Tensor;     # int32 [total prompt tokens]
  promptOffsets @6 :Tensor;    # int64 [numSequences + 1]
  responseTokens @7 :Tensor;   # int32 [total response tokens] (model and environment tokens)
  responseOffsets @8 :Tensor;  # int64 [numSequences + 1]
  behaviourLogprobs @9 :Tensor;  # float32 [total response tokens]: log-prob the sampler used (0 where mask is 0)
  lossMask @10 :Tensor;        # uint8 [total response tokens]: 1 = model token (trained), 0 = environment token
  tokenVersions @11 :Tensor;   # int64 [total response tokens], optional: version that sampled each token
  sequences @12 :List(SequenceMeta);
  generateTimeNs @13 :Int64;   # wall time spent generating this batch
  createdNs @14 :Int64;        # wall clock when generation started
  producerIncarnation @15 :UInt64;  # the producer process's incarnation (with `producer`, the
                                    # accounting source of the batch); 0 = unknown
  grantLearner @16 :UInt64;    # incarnation of the learner process whose credits started
                               # `grantedGroups` of its groups (staleness control)
  grantedGroups @17 :UInt32;   # groups of this batch that learner granted (the others were
                               # granted by an earlier learner process)
  sequenceVersions @18 :Tensor;  # int64 [numSequences], optional: the version each sequence's
                                 # group started from (>= policyVersion, their minimum); the
                                 # learner gates each group by its own version
}

# Per-sequence outcome of scoring.
struct RewardDetail {
  scorer @0 :Text;             # verifier or service that produced the reward
  failure @1 :Text;            # non-empty when scoring failed (reward is then 0)
  unscored @3 :Bool;           # no reward could be computed and the service's on_failure is
                               # drop: the learner leaves the sequence out (dropped_unscored)
  components @2 :List(Stat);   # partial-credit components, if any
}

# reward -> learner: the rollout plus one reward per sequence.
struct ScoredBatch {
  rollout @0 :RolloutBatch;
  rewards @1 :Tensor;          # float32 [numSequences]; must be finite
  details @2 :List(RewardDetail);
  scorer @3 :Text;             # reward actor id
  scoreTimeNs @4 :Int64;
}

# Reliable delivery: the receiver acknowledges sequence numbers it has
# processed (not merely received). `rejected` entries were processed and found
# invalid: the sender must not retry them.
struct Ack {
  seqs @0 :List(UInt64);       # processed successfully (or duplicates of processed ones)
  rejected @1 :List(Rejection);
  receiverIncarnation @2 :UInt64;
  deliveredThrough @3 :UInt64; # every seq below this was delivered to the receiving application (maybe not yet processed); 0 = unknown
  processedThrough @4 :UInt64; # every seq below this was processed: accepted unless listed in `rejected` (unresolved rejections are repeated in every ack); 0 = unknown
  streamIncarnation @5 :UInt64; # the sender incarnation whose stream this acknowledges; a sender
                                # ignores acks for another one (a restarted sender reusing its
                                # predecessor's routing id must not take its acks); 0 = unknown
}

struct Rejection {
  seq @0 :UInt64;
  reason @1 :Text;
}

# ---------------------------------------------------------------- weights

# Layout of one weight broadcast: which tensors, where in which bucket.
struct WeightsManifest {
  version @0 :UInt64;
  epoch @1 :UInt64;            # broadcast-group epoch it belongs to
  wireDtype @2 :DType;         # dtype of floating tensors on the wire (float32 or bfloat16)
  bucketBytes @3 :UInt64;      # bucket size used for packing
  tensors @4 :List(TensorSlot);
  bucketChecksums @5 :List(UInt64);  # optional: one per bucket (empty: no checksums)
  totalBytes @6 :UInt64;
  chunkBytes @7 :UInt64;       # pipelining unit of chain transfers (zmq chunks, gloo send/recv)
  shmSegment @8 :Text;         # shm backend: POSIX shm name holding this version (empty: not via shm)
  shmOffset @9 :UInt64;        # shm backend: byte offset of the stream inside the segment
  shmGeneration @10 :UInt64;   # shm backend: slot generation (seqlock) the reader must see before and after
  chunkToken @11 :UInt64;      # random per transfer: every WeightsChunk of it carries the same token
                               # (a peer that cannot read the manifest cannot forge its chunks)
}

struct TensorSlot {
  name @0 :Text;               # Hugging Face parameter name
  dtype @1 :DType;             # dtype the receiver stores it in
  shape @2 :List(Int64);
  bucket @3 :UInt32;
  offset @4 :UInt64;           # byte offset inside the bucket
  bytes @5 :UInt64;            # byte length on the wire
}

# One chunk of the weight stream (zmq backend, newcomer catch-up, shm members on other
# nodes), learner or chain predecessor -> receiver data socket.
struct WeightsChunk {
  version @0 :UInt64;
  bucket @1 :UInt32;
  offset @2 :UInt64;           # byte offset inside the bucket
  data @3 :Data;               # unused (must be empty): the bytes travel in `payload`
  last @4 :Bool;               # last chunk of the whole broadcast
  transfer @5 :UInt64;         # the manifest's epoch field: group epoch, or a catch-up id (top bit set)
  payload @6 :Tensor;          # uint8 [n]: the chunk's bytes (their own frame, sent without a copy)
  token @7 :UInt64;            # the manifest's chunkToken
}

# learner -> members: the broadcast group for an epoch.
struct BroadcastGroup {
  epoch @0 :UInt64;
  backend @1 :Text;            # "gloo", "nccl", "zmq", "shm"
  members @2 :List(Text);      # actor ids; index = rank (rank 0 is the learner)
  storeAddress @3 :Text;       # gloo: this epoch's rendezvous store (a transport endpoint, tcp://host:port)
  ncclUniqueId @4 :Data;       # 128-byte ncclUniqueId for the nccl backend
  timeoutMs @5 :UInt32;        # collective timeout
  memberEndpoints @6 :List(Text);  # data endpoint of each member (index = rank; zmq chain/star)
  algorithm @7 :Text;          # data path: "chain", "broadcast" (gloo) or "star" (zmq)
  storePrefix @8 :Text;        # gloo: this epoch's secret key prefix in the rendezvous store at
                               # storeAddress (random per epoch; the store refuses other keys)
}

# receiver -> learner, on the rendezvous socket of one epoch (storeAddress): one operation
# on the key-value store a gloo group forms through (c10d::Store semantics). Only members of
# the epoch learn the address and the prefix (BroadcastGroup, on the control socket).
enum StoreOp {
  set @0;                      # keys[0] = value
  get @1;                      # value of keys[0]; held until it exists or timeoutMs
  add @2;                      # keys[0] += delta (an integer in decimal text); reply: new value
  check @3;                    # number = 1 when every key exists, else 0
  wait @4;                     # held until every key exists or timeoutMs
  deleteKey @5;                # number = 1 when keys[0] existed
  numKeys @6;                  # number = keys in this epoch's store
  compareSet @7;               # keys[0] = value if it equals `expected` (or is missing and
                               # `expected` is empty); reply value: the value now
}

struct StoreRequest {
  id @0 :UInt64;               # echoed in the reply
  op @1 :StoreOp;
  keys @2 :List(Text);         # full keys, each starting with the epoch's storePrefix
  value @3 :Data;              # set, compareSet: the new value
  expected @4 :Data;           # compareSet: the value expected now
  delta @5 :Int64;             # add
  timeoutMs @6 :UInt32;        # get, wait: longest time the learner holds the request
}

struct StoreReply {
  id @0 :UInt64;               # the request's id
  ok @1 :Bool;
  error @2 :Text;              # when not ok: one line (timeout, key outside the prefix, limits)
  value @3 :Data;              # get, compareSet
  number @4 :Int64;            # add, check, deleteKey, numKeys
}

# ---------------------------------------------------------------- reference

# The echo actor's message (actors/echo): a text and an optional payload.
struct Echo {
  text @0 :Text;
  payload @1 :Tensor;
}

# ---------------------------------------------------------------- admission

# rollout <-> learner: staleness control (DESIGN invariant 3). A rollout actor
# asks for permission to start groups; the learner grants while the admitted
# work stays within (max_policy_lag + version + 1) x groups per update, with
# dropped work returned to the pool. Losing one is harmless: the rollout
# actor asks again after a timeout.
struct Credit {
  requested @0 :UInt32;        # rollout -> learner: groups it wants to start
  granted @1 :UInt32;          # learner -> rollout: groups it may start now
  learnerVersion @2 :UInt64;   # learner -> rollout: the learner's version
  outstanding @3 :UInt32;      # rollout -> learner: groups granted but not yet sent
  returned @4 :UInt32;         # rollout -> learner: granted groups it will never start
                               # (it is draining); the learner grants them to others
  grantsSeen @5 :UInt64;       # rollout -> learner: groups granted to it by this learner
                               # process that it has received so far; the learner treats
                               # its later grants as in transit and subtracts them from
                               # `requested`, so a want re-sent early is never granted twice
  abandoned @6 :UInt64;        # rollout -> learner: groups granted by learner process
                               # `abandonedLearner` that this actor started and cut short
                               # because they outlived max_policy_lag (the lag gate could only
                               # drop them), cumulative: the learner frees the capacity of those
                               # it has not freed yet, so a lost or repeated message is harmless
  abandonedLearner @7 :UInt64; # the learner process (incarnation) those grants came from
}


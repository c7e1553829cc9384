#include "troupe/transport/curve.h"

#include <zmq.h>

#include <set>

namespace troupe::transport {

bool CurveAvailable() {
  return zmq_has("curve") != 0;
}

Result<std::string> Z85Encode(const std::string& bytes) {
  if (bytes.size() % 4 != 0) {
    return InvalidArgument("Z85 encodes multiples of 4 bytes; got {} bytes", bytes.size());
  }
  std::string out(bytes.size() * 5 / 4 + 1, '\0');
  if (zmq_z85_encode(out.data(), reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) ==
      nullptr) {
    return Internal("zmq_z85_encode failed for {} bytes", bytes.size());
  }
  out.pop_back();  // trailing NUL
  return out;
}

Result<std::string> Z85Decode(const std::string& text) {
  if (text.size() % 5 != 0) {
    return InvalidArgument("Z85 text length must be a multiple of 5; got {} characters",
                           text.size());
  }
  std::string out(text.size() * 4 / 5, '\0');
  if (zmq_z85_decode(reinterpret_cast<uint8_t*>(out.data()), text.c_str()) == nullptr) {
    return InvalidArgument("'{}' is not valid Z85", text);
  }
  return out;
}

Result<CurveKeyPair> GenerateCurveKeyPair() {
  if (!CurveAvailable()) return Unavailable("libzmq was built without CURVE (libsodium)");
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return Internal("zmq_curve_keypair failed: {}", zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{std::string(pub, 40), std::string(sec, 40)};
}

Result<std::string> CurvePublicKey(const std::string& secret_key_z85) {
  if (!CurveAvailable()) return Unavailable("libzmq was built without CURVE (libsodium)");
  if (secret_key_z85.size() != 40) {
    return InvalidArgument("CURVE secret key must be 40 Z85 characters; got {}",
                           secret_key_z85.size());
  }
  char pub[41];
  if (zmq_curve_public(pub, secret_key_z85.c_str()) != 0) {
    return InvalidArgument("CURVE secret key is not valid Z85");
  }
  return std::string(pub, 40);
}

namespace {
Status CheckKey(const std::string& key, const char* what) {
  if (key.size() != 40) {
    return InvalidArgument("{} must be 40 Z85 characters (32 bytes); got {} characters", what,
                           key.size());
  }
  auto raw = Z85Decode(key);
  if (!raw.ok()) return InvalidArgument("{} is not valid Z85", what);
  return Status::Ok();
}
}  // namespace

Status CurveKeyPair::Validate() const {
  TROUPE_RETURN_IF_ERROR(CheckKey(public_key, "curve public key"));
  TROUPE_RETURN_IF_ERROR(CheckKey(secret_key, "curve secret key"));
  TROUPE_ASSIGN_OR_RETURN(std::string derived, CurvePublicKey(secret_key));
  if (derived != public_key) {
    return InvalidArgument("curve public key does not belong to the secret key");
  }
  return Status::Ok();
}

Status CurveOptions::Validate() const {
  if (!enabled) return Status::Ok();
  if (!CurveAvailable()) return Unavailable("curve.enabled but libzmq was built without CURVE");
  TROUPE_RETURN_IF_ERROR(CheckKey(server.public_key, "curve.server.public_key"));
  if (!server.secret_key.empty()) {
    TROUPE_RETURN_IF_ERROR(server.Validate().WithContext("curve.server"));
  }
  if (!client.public_key.empty() || !client.secret_key.empty()) {
    TROUPE_RETURN_IF_ERROR(client.Validate().WithContext("curve.client"));
  }
  for (size_t i = 0; i < allowed_client_public_keys.size(); ++i) {
    TROUPE_RETURN_IF_ERROR(
        CheckKey(allowed_client_public_keys[i],
                 fmt::format("curve.allowed_client_public_keys[{}]", i).c_str()));
  }
  return Status::Ok();
}

}  // namespace troupe::transport

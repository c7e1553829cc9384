// CURVE authentication and encryption for ZeroMQ sockets (libsodium).
//
// A job generates keys once (GenerateCurveKeyPair) and the launcher delivers
// them to actors in a file or on stdin, never on the command line. With
// CurveOptions enabled, every server/publisher socket of a ZmqNetwork is a
// CURVE server with `server` keys, every client/subscriber uses `client` keys
// and authenticates the server by its public key. When
// allowed_client_public_keys is non-empty the network runs a ZAP handler that
// refuses every client key not in the list (counted as auth_denied), so a
// peer that only knows the server's public key is refused too.
//
// Keys are Z85 strings (40 characters for 32 bytes). All functions are
// thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/core/status.h"

namespace troupe::transport {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters

  // InvalidArgument unless both keys are valid Z85 of 32 bytes and the public
  // key belongs to the secret key.
  Status Validate() const;
};

// A fresh keypair from libsodium. kUnavailable if libzmq lacks CURVE.
Result<CurveKeyPair> GenerateCurveKeyPair();
// The public key of a Z85 secret key.
Result<std::string> CurvePublicKey(const std::string& secret_key_z85);
// True if this libzmq was built with CURVE support.
bool CurveAvailable();

// Z85 (ZeroMQ base-85) for byte strings whose length is a multiple of 4.
Result<std::string> Z85Encode(const std::string& bytes);
Result<std::string> Z85Decode(const std::string& text);

struct CurveOptions {
  // Encrypt and authenticate every socket of the network. Default false.
  bool enabled = false;
  // The job's server keypair: servers/publishers use it; clients/subscribers
  // need server.public_key (secret may be empty on pure clients).
  CurveKeyPair server;
  // This process's client keypair (clients/subscribers). May be the job's
  // shared client keypair.
  CurveKeyPair client;
  // Client public keys (Z85) a server accepts; empty = any client that knows
  // the server's public key.
  std::vector<std::string> allowed_client_public_keys;

  Status Validate() const;
};

}  // namespace troupe::transport

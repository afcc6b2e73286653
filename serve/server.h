// The websocket side of `vlatune serve`, as openpi's WebsocketPolicyServer behaves (websocketpp over standalone
// Asio; torch-free): on connect the server sends the metadata message (binary); each binary message the client
// sends is handed to the handler, whose reply goes back as a binary message, or as a text message when the
// handler refuses the observation (openpi-client raises a text reply as an error). Unlike openpi, which closes the
// connection after an error, the connection stays open: the next observation is served.
//
// Several clients may be connected; their messages are served one at a time, in arrival order, on one thread (one
// model). A message larger than max_message_bytes gets a text reply; one larger than 4 x max_message_bytes closes
// its connection with status 1009 (message too big) before it is read whole. GET /healthz answers "OK" (openpi's
// health check). SIGINT or SIGTERM stops listening, closes every connection (status 1001, going away) and returns.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

namespace vlatune::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (reported through on_listening)
  int64_t max_message_bytes = int64_t{64} << 20;
};

struct Response {
  bool binary = true;   // false: a text message (an error description)
  std::string payload;  // msgpack bytes, or the text
};

// payload: one binary message; prev_total_ms: this connection's previous request, receive to reply sent (ms; a
// negative value when there was none). Must not throw (an exception is answered as a text message anyway).
using Handler = std::function<Response(const std::string& payload, double prev_total_ms)>;

// Serves until SIGINT/SIGTERM; returns the signal number that stopped it. `on_listening(port)` runs once the socket
// listens. Throws std::runtime_error when the address cannot be bound (naming it).
int run_server(const ServerOptions& options, const std::string& metadata_message, const Handler& handler,
               const std::function<void(int port)>& on_listening, std::ostream& log);

}  // namespace vlatune::serve

#include "serve/server.h"

#include <csignal>

#include <chrono>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include <websocketpp/config/asio_no_tls.hpp>
#include <websocketpp/server.hpp>

namespace vlatune::serve {

namespace {

using WsServer = websocketpp::server<websocketpp::config::asio>;
using Hdl = websocketpp::connection_hdl;
using Clock = std::chrono::steady_clock;

}  // namespace

int run_server(const ServerOptions& options, const std::string& metadata_message, const Handler& handler,
               const std::function<void(int port)>& on_listening, std::ostream& log) {
  WsServer server;
  server.clear_access_channels(websocketpp::log::alevel::all);
  server.clear_error_channels(websocketpp::log::elevel::all);
  // Only fatal errors: "rerror" reports every client that disconnects without a close frame and the aborted accept
  // at shutdown, both normal here; the server logs its own refusals and send failures.
  server.set_error_channels(websocketpp::log::elevel::fatal);
  server.get_elog().set_ostream(&log);
  server.init_asio();
  server.set_reuse_addr(true);
  // Frames past this close the connection (1009) unread; messages between max and this get a text reply.
  server.set_max_message_size(static_cast<size_t>(4 * options.max_message_bytes));

  std::map<Hdl, double, std::owner_less<Hdl>> open;  // connection -> its previous request's total ms (< 0: none)
  int64_t served = 0, refused = 0;

  server.set_open_handler([&](Hdl hdl) {
    open[hdl] = -1.0;
    websocketpp::lib::error_code ec;
    server.send(hdl, metadata_message, websocketpp::frame::opcode::binary, ec);
    if (ec) log << "serve: could not send the metadata to a new client: " << ec.message() << std::endl;
  });
  server.set_close_handler([&](Hdl hdl) { open.erase(hdl); });
  server.set_fail_handler([&](Hdl hdl) { open.erase(hdl); });
  server.set_http_handler([&](Hdl hdl) {
    WsServer::connection_ptr con = server.get_con_from_hdl(hdl);
    if (con->get_resource() == "/healthz") {
      con->set_status(websocketpp::http::status_code::ok);
      con->set_body("OK\n");
    } else {
      con->set_status(websocketpp::http::status_code::not_found);
      con->set_body("vlatune serve speaks openpi's websocket policy protocol; GET /healthz for a health check\n");
    }
  });
  server.set_message_handler([&](Hdl hdl, WsServer::message_ptr msg) {
    const auto t0 = Clock::now();
    Response reply;
    const std::string& payload = msg->get_payload();
    if (msg->get_opcode() != websocketpp::frame::opcode::binary) {
      reply = {false,
               "vlatune serve: expected a binary message (a msgpack observation, as openpi-client sends), "
               "got a text message"};
    } else if (static_cast<int64_t>(payload.size()) > options.max_message_bytes) {
      reply = {false, "vlatune serve: the message has " + std::to_string(payload.size()) +
                          " bytes, above the server's limit of " + std::to_string(options.max_message_bytes) +
                          " bytes (vlatune serve --max-message-mb)"};
    } else {
      auto it = open.find(hdl);
      const double prev = it == open.end() ? -1.0 : it->second;
      try {
        reply = handler(payload, prev);
      } catch (const std::exception& e) {
        reply = {false, std::string("vlatune serve: internal error: ") + e.what()};
      }
    }
    websocketpp::lib::error_code ec;
    server.send(hdl, reply.payload,
                reply.binary ? websocketpp::frame::opcode::binary : websocketpp::frame::opcode::text, ec);
    if (ec) log << "serve: could not send a reply: " << ec.message() << std::endl;
    ++(reply.binary ? served : refused);
    if (!reply.binary) log << "serve: refused an observation: " << reply.payload << std::endl;
    auto it = open.find(hdl);
    if (it != open.end()) it->second = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  });

  websocketpp::lib::error_code ec;
  const auto address = asio::ip::make_address(options.host, ec);
  if (ec) throw std::runtime_error("--host " + options.host + ": not an IP address (" + ec.message() + ")");
  server.listen(asio::ip::tcp::endpoint(address, static_cast<unsigned short>(options.port)), ec);
  if (ec)
    throw std::runtime_error("cannot listen on " + options.host + ":" + std::to_string(options.port) + ": " +
                             ec.message());
  server.start_accept(ec);
  if (ec) throw std::runtime_error("cannot accept connections: " + ec.message());
  const int port = server.get_local_endpoint(ec).port();
  if (ec) throw std::runtime_error("cannot read the listening port: " + ec.message());

  int stopped_by = 0;
  asio::signal_set signals(server.get_io_service(), SIGINT, SIGTERM);
  signals.async_wait([&](const asio::error_code& error, int signal) {
    if (error) return;
    stopped_by = signal;
    websocketpp::lib::error_code ignored;
    server.stop_listening(ignored);
    std::vector<Hdl> handles;  // close handlers erase from `open`: iterate over a copy
    for (const auto& item : open) handles.push_back(item.first);
    for (const Hdl& hdl : handles)
      server.close(hdl, websocketpp::close::status::going_away, "server stopping", ignored);
  });
  on_listening(port);
  server.run();
  log << "serve: stopped by "
      << (stopped_by == SIGINT    ? "SIGINT"
          : stopped_by == SIGTERM ? "SIGTERM"
                                  : "its loop")
      << " after " << served << " observations served, " << refused << " refused" << std::endl;
  return stopped_by;
}

}  // namespace vlatune::serve

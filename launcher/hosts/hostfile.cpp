#include "launcher/hosts/hostfile.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "ddp/base/error.h"
#include "ddp/base/printable.h"
#include "ddp/base/str.h"
#include "launcher/config/config.h"

namespace ddp::launcher::hosts {
namespace {

// Note [Host names]
// ~~~~~~~~~~~~~~~~~
// A host name goes to --ssh_cmd as an argument of its own, so no shell reads it, but ssh would
// read "-oProxyCommand=..." as an option: names are letters, digits, '.', '_' and '-', not
// starting with '-' or '.'. That covers DNS names, IPv4 addresses and ssh_config aliases; an IPv6
// address or a user@ prefix belongs in ~/.ssh/config (Host alias).
void check_host_name(const std::string& host, const std::string& where) {
  const bool ok = !host.empty() && host[0] != '-' && host[0] != '.' &&
                  host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
                      std::string::npos;
  if (!ok) {
    throw UsageError(ddp::str(where, ": '", ddp::printable(host),
                              "' is not a host name (letters, digits, '.', '_', '-'; for users, ports or IPv6 "
                              "addresses use a Host alias in ~/.ssh/config)"));
  }
}

std::vector<int> all_slots(int slots) {
  std::vector<int> out(static_cast<size_t>(slots));
  for (int i = 0; i < slots; ++i) out[static_cast<size_t>(i)] = i;
  return out;
}

HostSlots make_host(const std::string& host, int slots) { return HostSlots{host, slots, all_slots(slots)}; }

// "host" or "host:0,2" of --include/--exclude: the host and its slots (empty: the whole host).
std::map<std::string, std::set<int>> parse_selection(const std::string& flag, const std::string& text,
                                                     const std::vector<HostSlots>& hosts) {
  std::map<std::string, std::set<int>> out;
  for (const std::string& item : config::split_list(text, '@')) {
    const auto colon = item.find(':');
    const std::string host = config::trim_blanks(item.substr(0, colon));
    const auto known = std::find_if(hosts.begin(), hosts.end(), [&](const HostSlots& h) { return h.host == host; });
    if (known == hosts.end()) {
      throw UsageError(ddp::str(flag, " '", ddp::printable(text), "': host '", ddp::printable(host), "' is not one of the job's hosts"));
    }
    std::set<int>& slots = out[host];
    if (colon == std::string::npos) continue;
    for (const std::string& slot : config::split_list(item.substr(colon + 1), ',')) {
      slots.insert(config::parse_int_flag(ddp::str(flag, " slot of ", host, " (", host, " has ", known->slots, " slots)"),
                                  config::trim_blanks(slot), 0, known->slots - 1));
    }
  }
  return out;
}

}  // namespace

bool is_env_name(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == std::string::npos;
}

std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& source) {
  std::vector<HostSlots> hosts;
  std::map<std::string, int> first_line;
  std::istringstream in(text);
  std::string raw;
  for (int number = 1; std::getline(in, raw); ++number) {
    const std::string line = config::trim_blanks(raw.substr(0, raw.find('#')));
    if (line.empty() || line == "\r") continue;
    const std::string where = ddp::str("hostfile ", source, " line ", number);
    std::istringstream words(line);
    std::string host, word;
    words >> host;
    check_host_name(host, where);
    int slots = 1;
    bool slots_seen = false;
    while (words >> word) {
      if (word.rfind("slots=", 0) != 0 || slots_seen) {
        throw UsageError(ddp::str(where, " (host ", ddp::printable(host), "): '", ddp::printable(line), "' is not 'HOST slots=N'"));
      }
      slots = config::parse_int_flag(ddp::str(where, " (host ", host, ") slots="), word.substr(6), 1, 1 << 16);
      slots_seen = true;
    }
    const auto [it, added] = first_line.emplace(host, number);
    if (!added) {
      throw UsageError(ddp::str(where, ": host ", host, " is listed twice (also line ", it->second,
                                "); give each host once with its slots"));
    }
    hosts.push_back(make_host(host, slots));
  }
  if (hosts.empty()) throw UsageError(ddp::str("hostfile ", source, " lists no hosts"));
  return hosts;
}

std::vector<HostSlots> parse_hosts_list(const std::string& text) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  for (const std::string& raw : config::split_list(text, ',')) {
    const std::string item = config::trim_blanks(raw);
    const auto colon = item.find(':');
    const std::string host = item.substr(0, colon);
    check_host_name(host, ddp::str("--hosts '", ddp::printable(text), "'"));
    const int slots = colon == std::string::npos
                          ? 1
                          : config::parse_int_flag(ddp::str("--hosts slots of ", host), item.substr(colon + 1), 1, 1 << 16);
    if (!seen.insert(host).second) {
      throw UsageError(ddp::str("--hosts '", ddp::printable(text), "': host ", host, " is listed twice; give each host once"));
    }
    hosts.push_back(make_host(host, slots));
  }
  if (hosts.empty()) throw UsageError("--hosts is empty (e.g. --hosts host1:4,host2:4)");
  return hosts;
}

std::vector<HostSlots> select_hosts(std::vector<HostSlots> hosts, const std::string& include,
                                    const std::string& exclude) {
  if (!include.empty() && !exclude.empty()) {
    throw UsageError("--include and --exclude exclude each other: give one");
  }
  if (include.empty() && exclude.empty()) return hosts;
  const bool including = !include.empty();
  const auto selection = parse_selection(including ? "--include" : "--exclude", including ? include : exclude, hosts);
  std::vector<HostSlots> out;
  for (HostSlots& h : hosts) {
    const auto named = selection.find(h.host);
    std::vector<int> kept;
    for (int slot : h.local_ranks) {
      const bool is_named = named != selection.end() && (named->second.empty() || named->second.count(slot) > 0);
      if (is_named == including) kept.push_back(slot);
    }
    if (kept.empty()) continue;
    h.local_ranks = kept;
    out.push_back(std::move(h));
  }
  if (out.empty()) throw UsageError(ddp::str("--exclude '", ddp::printable(exclude), "' leaves no host"));
  return out;
}

std::vector<std::pair<std::string, std::string>> parse_env_file(const std::string& text, const std::string& source) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string trimmed = config::trim_blanks(line);
    if (trimmed.empty() || trimmed[0] == '#') continue;
    const auto eq = trimmed.find('=');
    const std::string name = eq == std::string::npos ? trimmed : trimmed.substr(0, eq);
    if (eq == std::string::npos || !is_env_name(name)) {
      throw UsageError(ddp::str(source, " line ", number, ": '", ddp::printable(trimmed),
                                "' is not NAME=VALUE (NAME: letters, digits and '_', not starting with a digit)"));
    }
    out.emplace_back(name, trimmed.substr(eq + 1));
  }
  return out;
}

}  // namespace ddp::launcher::hosts
